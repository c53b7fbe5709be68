package redisstore_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
	"github.com/fair-queue/caddy-fair-queue/fairqueue/memstore"
	"github.com/fair-queue/caddy-fair-queue/internal/redistest"
)

// An instance cut off from Redis moves its waiters into its fallback
// queue; their cancels fail, and Redis keeps them queued. The other
// instance's release grants the first of them, for nobody (the cut-off
// instance reads nothing): once the link heals, the cut-off instance
// gives that permit back (its resubscription's reconcile) and the next
// such grant too (its Pub/Sub), so the other instance's waiter is
// served within its max wait, shorter than the lease that would
// otherwise free the permits; and once both leave, no key is left.
func TestCutOffInstancesMovedWaitersHoldNoPermitForNobodyOnceHealed(t *testing.T) {
	srv := redistest.Start(t)
	const name = "cutoffgrants"
	cfg := fairqueue.Config{Permits: 1, Fallback: memstore.New(),
		Lease: time.Minute, PollInterval: 50 * time.Millisecond, MaxWait: 20 * time.Second}
	warm := fairqueue.Request{}
	a, b, px := cutOffPair(t, srv, name, cfg, warm, warm)
	ctx := context.Background()
	held, err := b.q.Acquire(ctx, fairqueue.Request{})
	require.NoError(t, err)

	// Two waiters of a queue in Redis behind b's permit.
	out := make(chan outcome, 2)
	for i := range 2 {
		waitInTurn(t, a, i, out)
	}
	require.Len(t, readState(t, b.rdb, name).Waiting, 2)

	px.Cut()
	eventually(t, 10*time.Second, func() bool { return !a.q.Stats().StoreUp }, "a never marked Redis down")
	// a's fallback queue serves them (waitInTurn releases each at once).
	for range 2 {
		o := <-out
		require.NoError(t, o.err, "waiter %d", o.i)
		assert.True(t, o.local, "waiter %d served by the fallback queue", o.i)
	}
	require.Len(t, readState(t, b.rdb, name).Waiting, 2, "their cancels failed: Redis keeps them queued")

	// b's release grants a's first moved ticket, for nobody.
	held.Release()
	eventually(t, 10*time.Second, func() bool {
		st := readState(t, b.rdb, name)
		return len(st.Holders) == 1 && len(st.Waiting) == 1
	}, "Redis never granted the moved ticket: %+v", readState(t, b.rdb, name))
	done := make(chan outcome, 1)
	go func() {
		p, err := b.q.Acquire(ctx, fairqueue.Request{})
		if err == nil {
			p.Release()
		}
		done <- outcome{err: err}
	}()
	eventually(t, 10*time.Second, func() bool { return len(readState(t, b.rdb, name).Waiting) == 2 },
		"b's waiter never queued")

	px.Heal()
	o := <-done
	require.NoError(t, o.err, "b's waiter, behind the grants a's moved tickets got")
	eventually(t, 10*time.Second, func() bool {
		st := readState(t, b.rdb, name)
		return len(st.Holders) == 0 && len(st.Waiting) == 0
	}, "a permit or ticket left for nobody: %+v", readState(t, b.rdb, name))
	require.NoError(t, a.q.Close())
	require.NoError(t, b.q.Close())
	assert.Empty(t, srv.Keys(t, "*"), "keys left after the last instance left")
}
