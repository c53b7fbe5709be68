package redisstore_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
	"github.com/fair-queue/caddy-fair-queue/internal/redistest"
)

// waitFor returns the acquire's result, failing the test if it never
// returns (Acquire ends at its context's deadline).
func waitFor(t *testing.T, ch <-chan acquired, what string) acquired {
	t.Helper()
	select {
	case r := <-ch:
		return r
	case <-time.After(rollbackCfg.MaxWait + 5*time.Second):
		t.Fatalf("%s: the acquire never returned", what)
	}
	return acquired{}
}

// beaten waits for n's first heartbeat (it goes at the first turn of
// the node's loop after it joined): a write lost after it is not made
// good by that first heartbeat.
func beaten(t *testing.T, n *node) {
	t.Helper()
	eventually(t, 5*time.Second, func() bool { return !n.q.Stats().Cluster.At.IsZero() }, "no heartbeat")
}

// An acquire a failover lost (the node's join with it: Redis forgets the
// node and its waiter) is queued again once the node subscribes again,
// and served when the permit frees, as is a waiter queued after the
// failover; Redis is left clean.
func TestLostAcquireIsQueuedAgainAfterTheResubscribe(t *testing.T) {
	srv := redistest.Start(t)
	const name = "lost-acquire"
	cfg := rollbackCfg
	a := newNode(t, srv, name, cfg)
	b := newNode(t, srv, name, cfg)
	admin := srv.Client(t)
	ctx, cancel := context.WithTimeout(context.Background(), cfg.MaxWait)
	defer cancel()

	held, err := a.q.Acquire(ctx, fairqueue.Request{})
	require.NoError(t, err)
	rollback := snapshot(t, admin)
	lost := acquireAsync(b, ctx) // b's join and its waiter: lost
	eventually(t, 5*time.Second, func() bool { return len(readState(t, admin, name).Waiting) == 1 }, "b's waiter never queued")
	rollback(func() { require.Empty(t, readState(t, admin, name).Waiting, "the rollback lost b's waiter") })
	eventually(t, 5*time.Second, func() bool { return len(readState(t, admin, name).Waiting) == 1 }, "b's waiter was not queued again")
	later := acquireAsync(a, ctx)
	eventually(t, 5*time.Second, func() bool { return len(readState(t, admin, name).Waiting) == 2 }, "a's waiter never queued")

	held.Release()
	first := waitFor(t, lost, "b's waiter")
	require.NoError(t, first.err, "b's waiter, queued again")
	select {
	case r := <-later:
		t.Fatalf("a's waiter started beside b's (err %v): 2 running with 1 permit", r.err)
	case <-time.After(100 * time.Millisecond):
	}
	first.p.Release()
	second := waitFor(t, later, "a's waiter")
	require.NoError(t, second.err, "a's waiter")
	second.p.Release()
	require.NoError(t, a.q.Close())
	require.NoError(t, b.q.Close())
	assert.Empty(t, srv.Keys(t, "*"), "keys left after every node left")
}

// A cancel a failover lost (the waiter left, Redis has it again) does
// not hold the permit: granted to the ticket that is gone, it is handed
// on to the next waiter at once, and Redis is left clean.
func TestLostCancelDoesNotHoldThePermit(t *testing.T) {
	srv := redistest.Start(t)
	const name = "lost-cancel"
	cfg := rollbackCfg
	a := newNode(t, srv, name, cfg)
	b := newNode(t, srv, name, cfg)
	admin := srv.Client(t)
	ctx, cancel := context.WithTimeout(context.Background(), cfg.MaxWait)
	defer cancel()

	held, err := a.q.Acquire(ctx, fairqueue.Request{})
	require.NoError(t, err)
	leave, left := context.WithCancel(ctx)
	gone := acquireAsync(b, leave)
	eventually(t, 5*time.Second, func() bool { return len(readState(t, admin, name).Waiting) == 1 }, "b's waiter never queued")
	rollback := snapshot(t, admin)
	left() // the cancel: lost
	require.ErrorIs(t, waitFor(t, gone, "b's leaving waiter").err, context.Canceled)
	eventually(t, 5*time.Second, func() bool { return len(readState(t, admin, name).Waiting) == 0 }, "b's cancel never reached Redis")
	rollback(func() { require.Len(t, readState(t, admin, name).Waiting, 1, "the rollback brought b's waiter back") })
	next := acquireAsync(a, ctx)
	eventually(t, 5*time.Second, func() bool { return len(readState(t, admin, name).Waiting) >= 1 }, "a's waiter never queued")

	held.Release()
	r := waitFor(t, next, "a's waiter")
	require.NoError(t, r.err, "a's waiter, behind the ghost of b's")
	r.p.Release()
	require.NoError(t, a.q.Close())
	require.NoError(t, b.q.Close())
	assert.Empty(t, srv.Keys(t, "*"), "keys left after every node left")
}

// A grant a failover lost (the request runs, Redis no longer counts it)
// is counted again by its node's heartbeat, sent at once when the node
// subscribes again (the failover dropped its Pub/Sub connection), not a
// third of a lease later: meanwhile every other node's request would run
// beside it, above the permits. A request of another node that comes
// after it waits for it.
func TestLostGrantIsCountedAgain(t *testing.T) {
	srv := redistest.Start(t)
	const name = "lost-grant"
	cfg := rollbackCfg
	a := newNode(t, srv, name, cfg)
	b := newNode(t, srv, name, cfg)
	admin := srv.Client(t)
	ctx, cancel := context.WithTimeout(context.Background(), cfg.MaxWait)
	defer cancel()
	for _, n := range []*node{a, b} {
		p, err := n.q.Acquire(ctx, fairqueue.Request{})
		require.NoError(t, err)
		p.Release()
		beaten(t, n)
	}

	rollback := snapshot(t, admin)
	held, err := a.q.Acquire(ctx, fairqueue.Request{}) // the grant: lost
	require.NoError(t, err)
	rollback(func() { require.Empty(t, readState(t, admin, name).Holders, "the rollback lost a's grant") })
	back := time.Now()
	eventually(t, cfg.Lease/6, func() bool { return len(readState(t, admin, name).Holders) == 1 },
		"a's running request was not counted again within %v of the rollback (its heartbeats are every %v)", cfg.Lease/6, cfg.Lease/3)
	t.Logf("counted again %v after the rollback", time.Since(back).Round(time.Millisecond))
	bctx, bcancel := context.WithTimeout(context.Background(), cfg.MaxWait)
	defer bcancel()
	beside := acquireAsync(b, bctx)
	eventually(t, 5*time.Second, func() bool { return len(readState(t, admin, name).Waiting) == 1 }, "b's request did not wait for a's")
	held.Release()
	r := waitFor(t, beside, "b's waiter")
	require.NoError(t, r.err)
	r.p.Release()
	require.NoError(t, a.q.Close())
	require.NoError(t, b.q.Close())
	assert.Empty(t, srv.Keys(t, "*"), "keys left after every node left")
}

// A requeue a failover lost (the old ticket holds in Redis again, the new
// one that took its permit back is unknown) neither holds the old permit
// for nobody nor lets in a request beside the new one: the node's
// heartbeat at the resubscribe counts the new one, its reconcile releases
// the old one.
func TestLostRequeueIsSortedOut(t *testing.T) {
	srv := redistest.Start(t)
	const name = "lost-requeue"
	cfg := rollbackCfg
	a := newNode(t, srv, name, cfg)
	b := newNode(t, srv, name, cfg)
	admin := srv.Client(t)
	ctx, cancel := context.WithTimeout(context.Background(), cfg.MaxWait)
	defer cancel()
	warm, err := b.q.Acquire(ctx, fairqueue.Request{})
	require.NoError(t, err)
	warm.Release()
	beaten(t, b)

	old, err := a.q.Acquire(ctx, fairqueue.Request{})
	require.NoError(t, err)
	beaten(t, a)
	rollback := snapshot(t, admin)
	held, err := old.Requeue(ctx, 0) // the requeue: lost
	require.NoError(t, err)
	eventually(t, 5*time.Second, func() bool {
		h := readState(t, admin, name).Holders
		return len(h) == 1 && h[0] == held.Ticket()
	}, "the requeue never reached Redis")
	rollback(func() {
		require.Equal(t, []string{old.Ticket()}, readState(t, admin, name).Holders, "the rollback brought the old ticket back")
	})
	back := time.Now()
	eventually(t, cfg.Lease/6, func() bool {
		h := readState(t, admin, name).Holders
		return len(h) == 1 && h[0] == held.Ticket()
	}, "Redis does not count the requeued request in place of the old ticket within %v of the rollback", cfg.Lease/6)
	t.Logf("sorted out %v after the rollback", time.Since(back).Round(time.Millisecond))
	bctx, bcancel := context.WithTimeout(context.Background(), cfg.MaxWait)
	defer bcancel()
	beside := acquireAsync(b, bctx)
	eventually(t, 5*time.Second, func() bool { return len(readState(t, admin, name).Waiting) == 1 }, "b's request did not wait for a's")
	held.Release()
	r := waitFor(t, beside, "b's waiter")
	require.NoError(t, r.err)
	r.p.Release()
	require.NoError(t, a.q.Close())
	require.NoError(t, b.q.Close())
	assert.Empty(t, srv.Keys(t, "*"), "keys left after every node left")
}
