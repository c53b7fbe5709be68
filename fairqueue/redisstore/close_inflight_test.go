package redisstore_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
	"github.com/fair-queue/caddy-fair-queue/internal/redistest"
)

// slowAcquire delays acquires on their way to Redis, as a loaded Redis
// or network would, once slow is set.
type slowAcquire struct {
	fairqueue.Store
	slow    atomic.Bool
	entered chan struct{}
}

func (s *slowAcquire) Acquire(ctx context.Context, t fairqueue.TicketArgs) (fairqueue.AcquireResult, error) {
	if s.slow.Load() {
		s.entered <- struct{}{}
		time.Sleep(1500 * time.Millisecond) // past the store timeout Close waits for its waiters
	}
	return s.Store.Acquire(ctx, t)
}

// An Acquire whose call is still on its way when the node closes is
// answered with the shutdown reject, never with a permit of a queue that
// has left, and the last node's leave leaves nothing in Redis: the acquire
// reaches Redis after the leave deleted the queue's keys.
func TestAnAcquireOnItsWayAtCloseLeavesNothingBehind(t *testing.T) {
	srv := redistest.Start(t)
	s := &slowAcquire{entered: make(chan struct{}, 1)}
	n := wrappedNode(t, srv, "closeinflight", fairqueue.Config{Permits: 1, MaxWait: 10 * time.Second},
		func(st fairqueue.Store) fairqueue.Store { s.Store = st; return s })
	p, err := n.q.Acquire(context.Background(), fairqueue.Request{})
	require.NoError(t, err)
	p.Release()
	s.slow.Store(true)
	waiter := acquireAsync(n, context.Background())
	<-s.entered
	require.NoError(t, n.q.Close())
	got := <-waiter
	if got.p != nil {
		got.p.Release()
	}
	time.Sleep(200 * time.Millisecond) // any call of the node still on its way ends
	assert.Empty(t, srv.Keys(t, "*"), "keys left after the last node left")
	assert.Nil(t, got.p, "a permit of a closed queue")
	assert.ErrorIs(t, got.err, fairqueue.ErrShuttingDown)
}

func (s *slowAcquire) Requeue(ctx context.Context, t fairqueue.RequeueArgs) (fairqueue.AcquireResult, error) {
	if s.slow.Load() {
		s.entered <- struct{}{}
		time.Sleep(1500 * time.Millisecond)
	}
	return s.Store.Requeue(ctx, t)
}

// The same with a requeue on its way (its upstream refused the request):
// the request gets the shutdown reject and nothing is left in Redis.
func TestARequeueOnItsWayAtCloseLeavesNothingBehind(t *testing.T) {
	srv := redistest.Start(t)
	s := &slowAcquire{entered: make(chan struct{}, 1)}
	cfg := fairqueue.Config{Permits: 1, MaxWait: 10 * time.Second, Upstreams: []fairqueue.Upstream{{Dial: "a:1", Permits: 1}}}
	n := wrappedNode(t, srv, "closerequeue", cfg, func(st fairqueue.Store) fairqueue.Store { s.Store = st; return s })
	p, err := n.q.Acquire(context.Background(), fairqueue.Request{})
	require.NoError(t, err)
	s.slow.Store(true)
	type requeued struct {
		p   *fairqueue.Permit
		err error
	}
	done := make(chan requeued, 1)
	go func() {
		p2, err := p.Requeue(context.Background(), -1)
		done <- requeued{p2, err}
	}()
	<-s.entered
	require.NoError(t, n.q.Close())
	got := <-done
	if got.p != nil {
		got.p.Release()
	}
	time.Sleep(200 * time.Millisecond) // any call of the node still on its way ends
	assert.Empty(t, srv.Keys(t, "*"), "keys left after the last node left")
	assert.Nil(t, got.p, "a permit of a closed queue")
	assert.ErrorIs(t, got.err, fairqueue.ErrShuttingDown)
}
