package redisstore_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
	"github.com/fair-queue/caddy-fair-queue/fairqueue/memstore"
	"github.com/fair-queue/caddy-fair-queue/internal/redistest"
)

// Local fallback, recovery: the waiters of the fallback queue move into
// the shared queue in the order they waited in the fallback queue, as a
// client of the instance expects: the earlier request is not served
// after the later ones because they moved at once.
func TestLocalFallbackWaitersMoveIntoTheSharedQueueInTheirOrder(t *testing.T) {
	t.Parallel() // its own redis-server: it waits on it, not on the CPU
	for _, tc := range []struct {
		name string
		fair bool
	}{{"fifo", false}, {"fair", true}} {
		t.Run(tc.name, func(t *testing.T) { t.Parallel(); fallbackMovesInOrder(t, tc.fair) })
	}
}

const movingWaiters = 8

func fallbackMovesInOrder(t *testing.T, fair bool) {
	srv := redistest.Start(t)
	n := newNode(t, srv, "fborder", fairqueue.Config{Permits: 1, LocalPermits: 1, Fallback: memstore.New(), Fair: fair,
		Lease: 1500 * time.Millisecond, PollInterval: 50 * time.Millisecond, MaxWait: 60 * time.Second})
	p, err := n.q.Acquire(context.Background(), fairqueue.Request{})
	require.NoError(t, err)
	p.Release()
	srv.Kill()

	// The one permit of the fallback queue, held until the waiters are
	// in the shared queue.
	held, err := n.q.Acquire(context.Background(), fairqueue.Request{})
	require.NoError(t, err)
	require.True(t, held.Local(), "the request after the outage was not served by the fallback queue")

	served := make(chan int, movingWaiters)
	errs := make(chan error, movingWaiters)
	for i := range movingWaiters {
		queueInTurn(t, n, i, served, errs, true)
	}

	srv.Restart()
	// The held local permit is adopted, the fallback queue retires and
	// its waiters move into the shared queue, behind the held permit.
	eventually(t, 20*time.Second, func() bool { return len(readState(t, n.rdb, "fborder").Waiting) == movingWaiters },
		"the fallback queue's waiters never moved into the shared queue")
	held.Release()

	assertServedInOrder(t, served, errs, movingWaiters, "the fallback queue's waiters, moved into the shared queue, served out of their order")
}

// queueInTurn starts request i on n, which reports to served (its index,
// once granted: its permit is released at once) or to errs; with wait,
// it returns once the request has queued (OnQueued), behind those
// started before it.
func queueInTurn(t *testing.T, n *node, i int, served chan<- int, errs chan error, wait bool) {
	t.Helper()
	queued := make(chan struct{})
	go func() {
		w, err := n.q.Acquire(context.Background(), fairqueue.Request{OnQueued: func(fairqueue.Waiting) {
			select {
			case <-queued:
			default:
				close(queued)
			}
		}})
		if err != nil {
			errs <- err
			return
		}
		served <- i
		w.Release()
	}()
	if !wait {
		return
	}
	select {
	case <-queued:
	case err := <-errs:
		t.Fatalf("waiter %d failed: %v", i, err)
	case <-time.After(10 * time.Second):
		t.Fatalf("waiter %d never queued", i)
	}
}
