package redisstore_test

import (
	"context"
	"errors"
	"io"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
	"github.com/fair-queue/caddy-fair-queue/fairqueue/memstore"
	"github.com/fair-queue/caddy-fair-queue/internal/redistest"
)

// answerSeenStore is a Store that, once watch is set, runs onAnswer
// (once) when Redis has answered an acquire, before the answer reaches
// the queue.
type answerSeenStore struct {
	fairqueue.Store
	watch    atomic.Bool
	once     sync.Once
	onAnswer func()
}

func (s *answerSeenStore) Acquire(ctx context.Context, a fairqueue.TicketArgs) (fairqueue.AcquireResult, error) {
	res, err := s.Store.Acquire(ctx, a)
	if err == nil && s.watch.Load() {
		s.once.Do(s.onAnswer)
	}
	return res, err
}

// A request whose acquire Redis answered (queued) as the instance marks
// the store down, between the answer and its ticket counting as queued,
// was left out of the move of the store's waiters into the fallback
// queue: it waited in Redis' queue, gone, until its max wait and the
// timeout reject, while the fallback queue served the requests that came
// after it. Here Redis dies as it answers (answerSeenStore), and the
// node's calls mark the store down; the answer, read then, marks it up
// again ("store reachable again", logged between the answer and the
// ticket counting as queued), and in that moment the node's calls mark
// it down again. The waiter is served by the fallback queue once the two
// permits Redis granted end.
func TestLocalFallbackTakesInAWaiterQueuedAsTheStoreIsMarkedDown(t *testing.T) {
	t.Parallel() // its own redis-server: it waits on it, not on the CPU
	srv := redistest.Start(t)
	var q atomic.Pointer[fairqueue.Queue]
	var seen *answerSeenStore
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	// markedDown waits until the node's reconciles, failing, mark the
	// store down (at most 10s: a hook cannot fail the test).
	markedDown := func() {
		for end := time.Now().Add(10 * time.Second); q.Load().Stats().StoreUp && time.Now().Before(end); {
			time.Sleep(time.Millisecond)
		}
	}
	var answered, again atomic.Bool
	logged := func(e zapcore.Entry) error {
		if e.Message == "store reachable again" && answered.Load() && again.CompareAndSwap(false, true) {
			markedDown()
		}
		return nil
	}
	// A long lease: no heartbeat meanwhile; the node reconciles every
	// poll while a request waits or the store is down.
	cfg := fairqueue.Config{Permits: 2, Fallback: memstore.New(), Lease: 3 * time.Minute,
		PollInterval: 50 * time.Millisecond, MaxWait: 20 * time.Second,
		Logger: zap.New(zapcore.NewCore(zapcore.NewConsoleEncoder(zap.NewDevelopmentEncoderConfig()), zapcore.AddSync(io.Discard), zap.InfoLevel),
			zap.Hooks(logged))}
	nd := wrappedNode(t, srv, "fbmissedmove", cfg, func(s fairqueue.Store) fairqueue.Store {
		seen = &answerSeenStore{Store: s, onAnswer: func() {
			srv.Kill()
			markedDown()
			answered.Store(true)
		}}
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
	require.True(t, again.Load(), "the answer did not mark the store up again")
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
