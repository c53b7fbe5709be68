package redisstore_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
	"github.com/fair-queue/caddy-fair-queue/fairqueue/memstore"
	"github.com/fair-queue/caddy-fair-queue/internal/redistest"
)

// slowAcquires delays every acquire on its way to Redis once slow is
// set, as a loaded Redis would; entered tells of the first.
type slowAcquires struct {
	fairqueue.Store
	slow    atomic.Bool
	entered chan struct{}
}

func (s *slowAcquires) Acquire(ctx context.Context, t fairqueue.TicketArgs) (fairqueue.AcquireResult, error) {
	if s.slow.Load() {
		select {
		case s.entered <- struct{}{}:
		default:
		}
		time.Sleep(200 * time.Millisecond)
	}
	return s.Store.Acquire(ctx, t)
}

// Local fallback, recovery: a request that arrives while the fallback
// queue's waiters are still moving into the shared queue (one after the
// other) queues behind them, as it arrived after them: it does not pass
// the waiters whose acquires have not reached Redis yet.
func TestARequestArrivingWhileFallbackWaitersMoveQueuesBehindThem(t *testing.T) {
	t.Parallel() // its own redis-server: it waits on it, not on the CPU
	const waiters = 4
	srv := redistest.Start(t)
	s := &slowAcquires{entered: make(chan struct{}, 1)}
	n := wrappedNode(t, srv, "fbnewcomer", fairqueue.Config{Permits: 1, LocalPermits: 1, Fallback: memstore.New(),
		Lease: 1500 * time.Millisecond, PollInterval: 50 * time.Millisecond, MaxWait: 60 * time.Second},
		func(st fairqueue.Store) fairqueue.Store { s.Store = st; return s })
	p, err := n.q.Acquire(context.Background(), fairqueue.Request{})
	require.NoError(t, err)
	p.Release()
	srv.Kill()

	held, err := n.q.Acquire(context.Background(), fairqueue.Request{})
	require.NoError(t, err)
	require.True(t, held.Local(), "the request after the outage was not served by the fallback queue")

	served := make(chan int, waiters+1)
	errs := make(chan error, waiters+1)
	for i := range waiters {
		queueInTurn(t, n, i, served, errs, true)
	}

	s.slow.Store(true)
	srv.Restart()
	select {
	case <-s.entered: // the fallback queue retired: its first waiter moves
	case <-time.After(20 * time.Second):
		t.Fatal("the fallback queue's waiters never moved")
	}
	queueInTurn(t, n, waiters, served, errs, false)
	eventually(t, 20*time.Second, func() bool { return len(readState(t, n.rdb, "fbnewcomer").Waiting) == waiters+1 },
		"the moving waiters and the new request never queued in the shared queue")
	held.Release()

	assertServedInOrder(t, served, errs, waiters+1, "a request that arrived after the fallback queue's waiters served before them")
}
