package redisstore_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
	"github.com/fair-queue/caddy-fair-queue/fairqueue/memstore"
	"github.com/fair-queue/caddy-fair-queue/internal/redistest"
)

// answerSeenStore is a Store that notes, once watch is set, that an
// acquire was answered by Redis.
type answerSeenStore struct {
	fairqueue.Store
	watch, answered atomic.Bool
}

func (s *answerSeenStore) Acquire(ctx context.Context, a fairqueue.TicketArgs) (fairqueue.AcquireResult, error) {
	res, err := s.Store.Acquire(ctx, a)
	if err == nil && s.watch.Load() {
		s.answered.Store(true)
	}
	return res, err
}

// A request whose acquire Redis answered (queued) as the instance marks
// the store down, between the answer and its ticket counting as queued,
// was left out of the move of the store's waiters into the fallback
// queue: it waited in Redis' queue, gone, until its max wait and the
// timeout reject, while the fallback queue served the requests that came
// after it. Here Redis dies in that moment (Config.ReservedTokens runs
// there, read for the ticket's permits once the answer is in), and
// another request finds it dead, marking the store down. The waiter is
// served by the fallback queue once the two permits Redis granted end.
func TestLocalFallbackTakesInAWaiterQueuedAsTheStoreIsMarkedDown(t *testing.T) {
	srv := redistest.Start(t)
	var q atomic.Pointer[fairqueue.Queue]
	var seen *answerSeenStore
	var killed atomic.Bool
	other := make(chan error, 1)
	// Long poll and lease: no call but the test's runs meanwhile.
	cfg := fairqueue.Config{Permits: 2, Fallback: memstore.New(), Lease: 3 * time.Minute,
		PollInterval: 20 * time.Second, MaxWait: 20 * time.Second}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cfg.ReservedTokens = func() int {
		if seen == nil || !seen.answered.Load() || !killed.CompareAndSwap(false, true) {
			return 0
		}
		func() {
			srv.Kill()
			go func() {
				p, err := q.Load().Acquire(ctx, fairqueue.Request{})
				if err == nil {
					p.Release()
				}
				other <- err
			}()
			for q.Load().Stats().StoreUp {
				time.Sleep(time.Millisecond)
			}
		}()
		return 0
	}
	nd := wrappedNode(t, srv, "fbmissedmove", cfg, func(s fairqueue.Store) fairqueue.Store {
		seen = &answerSeenStore{Store: s}
		return seen
	})
	q.Store(nd.q)
	a, err := nd.q.Acquire(ctx, fairqueue.Request{})
	require.NoError(t, err)
	c, err := nd.q.Acquire(ctx, fairqueue.Request{})
	require.NoError(t, err)
	require.False(t, a.Local() || c.Local(), "granted by Redis")

	seen.watch.Store(true)
	type result struct {
		p   *fairqueue.Permit
		err error
	}
	queued := make(chan struct{})
	var once sync.Once
	waiter := make(chan result, 1)
	go func() {
		p, err := nd.q.Acquire(ctx, fairqueue.Request{OnQueued: func(fairqueue.Waiting) { once.Do(func() { close(queued) }) }})
		waiter <- result{p, err}
	}()
	select {
	case <-queued:
	case r := <-waiter:
		t.Fatalf("the waiter was answered with both permits held: %v", r.err)
	}
	require.False(t, nd.q.Stats().StoreUp, "the store is marked down")

	// Redis' two permits end: the fallback queue has room for both waiters.
	a.Release()
	c.Release()
	require.NoError(t, <-other, "the request that found Redis dead")
	r := <-waiter
	var rej *fairqueue.RejectError
	if errors.As(r.err, &rej) {
		t.Fatalf("the waiter queued in Redis as the store was marked down was rejected (%s) after %v, the fallback queue idle",
			rej.Reason, rej.Waited.Round(time.Millisecond))
	}
	require.NoError(t, r.err, "the waiter queued in Redis as the store was marked down")
	assert.True(t, r.p.Local(), "served by the fallback queue")
	r.p.Release()
}
