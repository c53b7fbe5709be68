package redisstore_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
)

// An acquire a failover lost (the node's join with it: Redis forgets the
// node and its waiter) is queued again once the node subscribes again,
// and served when the permit frees, as is a waiter queued after the
// failover; Redis is left clean.
func TestLostAcquireIsQueuedAgainAfterTheResubscribe(t *testing.T) {
	s := newScene(t, "lost-acquire", rollbackCfg)
	a, b := s.a, s.b

	held, err := a.q.Acquire(s.ctx, fairqueue.Request{})
	require.NoError(t, err)
	rollback := snapshot(t, s.admin)
	lost := acquireAsync(b, s.ctx) // b's join and its waiter: lost
	s.waiting(t, 1, "b's waiter never queued")
	rollback(func() { require.Empty(t, s.state(t).Waiting, "the rollback lost b's waiter") })
	s.waiting(t, 1, "b's waiter was not queued again")
	later := acquireAsync(a, s.ctx)
	s.waiting(t, 2, "a's waiter never queued")

	held.Release()
	first := waitFor(t, lost, "b's waiter")
	require.NoError(t, first.err, "b's waiter, queued again")
	stillWaiting(t, later, "a's waiter started beside b's: 2 running with 1 permit")
	first.p.Release()
	served(t, later, "a's waiter", "a's waiter")
	s.leave(t)
}

// A cancel a failover lost (the waiter left, Redis has it again) does
// not hold the permit: granted to the ticket that is gone, it is handed
// on to the next waiter at once, and Redis is left clean.
func TestLostCancelDoesNotHoldThePermit(t *testing.T) {
	s := newScene(t, "lost-cancel", rollbackCfg)
	a, b := s.a, s.b

	held, err := a.q.Acquire(s.ctx, fairqueue.Request{})
	require.NoError(t, err)
	leave, left := context.WithCancel(s.ctx)
	gone := acquireAsync(b, leave)
	s.waiting(t, 1, "b's waiter never queued")
	rollback := snapshot(t, s.admin)
	left() // the cancel: lost
	require.ErrorIs(t, waitFor(t, gone, "b's leaving waiter").err, context.Canceled)
	s.waiting(t, 0, "b's cancel never reached Redis")
	rollback(func() { require.Len(t, s.state(t).Waiting, 1, "the rollback brought b's waiter back") })
	next := acquireAsync(a, s.ctx)
	eventually(t, 5*time.Second, func() bool { return len(s.state(t).Waiting) >= 1 }, "a's waiter never queued")

	held.Release()
	served(t, next, "a's waiter", "a's waiter, behind the ghost of b's")
	s.leave(t)
}

// A grant a failover lost (the request runs, Redis no longer counts it)
// is counted again by its node's heartbeat, sent at once when the node
// subscribes again (the failover dropped its Pub/Sub connection), not a
// third of a lease later: meanwhile every other node's request would run
// beside it, above the permits. A request of another node that comes
// after it waits for it.
func TestLostGrantIsCountedAgain(t *testing.T) {
	s := newScene(t, "lost-grant", rollbackCfg)
	a, b, cfg := s.a, s.b, s.cfg
	warmUp(t, fairqueue.Request{}, a, b)

	rollback := snapshot(t, s.admin)
	held, err := a.q.Acquire(s.ctx, fairqueue.Request{}) // the grant: lost
	require.NoError(t, err)
	rollback(func() { require.Empty(t, s.state(t).Holders, "the rollback lost a's grant") })
	back := time.Now()
	eventually(t, cfg.Lease/6, func() bool { return len(s.state(t).Holders) == 1 },
		"a's running request was not counted again within %v of the rollback (its heartbeats are every %v)", cfg.Lease/6, cfg.Lease/3)
	t.Logf("counted again %v after the rollback", time.Since(back).Round(time.Millisecond))
	beside := acquireAsync(b, s.fresh(t))
	s.waiting(t, 1, "b's request did not wait for a's")
	held.Release()
	served(t, beside, "b's waiter")
	s.leave(t)
}

// A requeue a failover lost (the old ticket holds in Redis again, the new
// one that took its permit back is unknown) neither holds the old permit
// for nobody nor lets in a request beside the new one: the node's
// heartbeat at the resubscribe counts the new one, its reconcile releases
// the old one.
func TestLostRequeueIsSortedOut(t *testing.T) {
	s := newScene(t, "lost-requeue", rollbackCfg)
	a, b, cfg := s.a, s.b, s.cfg
	warmUp(t, fairqueue.Request{}, b)

	old, err := a.q.Acquire(s.ctx, fairqueue.Request{})
	require.NoError(t, err)
	beaten(t, a)
	rollback := snapshot(t, s.admin)
	held, err := old.Requeue(s.ctx, 0) // the requeue: lost
	require.NoError(t, err)
	eventually(t, 5*time.Second, s.holdsOnly(t, held.Ticket()), "the requeue never reached Redis")
	rollback(func() {
		require.Equal(t, []string{old.Ticket()}, s.state(t).Holders, "the rollback brought the old ticket back")
	})
	back := time.Now()
	eventually(t, cfg.Lease/6, s.holdsOnly(t, held.Ticket()),
		"Redis does not count the requeued request in place of the old ticket within %v of the rollback", cfg.Lease/6)
	t.Logf("sorted out %v after the rollback", time.Since(back).Round(time.Millisecond))
	beside := acquireAsync(b, s.fresh(t))
	s.waiting(t, 1, "b's request did not wait for a's")
	held.Release()
	served(t, beside, "b's waiter")
	s.leave(t)
}
