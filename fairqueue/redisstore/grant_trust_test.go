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

// TestGrantMessagesWakeAHealthyNodesWaiters hands one permit from node b
// to node a's waiter again and again, for longer than the lease: a node
// whose heartbeats find it alive keeps trusting the grants Redis sends
// it, and starts its waiter on the message (numbered), not a poll later
// on the reconcile that would find the grant (GrantNo 0). A node reads a
// grant as one Redis may have taken back only after a lease with no
// heartbeat that confirmed it (a stop, a partition); heartbeats run
// every lease/3.
func TestGrantMessagesWakeAHealthyNodesWaiters(t *testing.T) {
	if testing.Short() {
		t.Skip("about 8s: skipped with -short")
	}
	srv := redistest.Start(t)
	cfg := fairqueue.Config{Permits: 1, MaxWait: 20 * time.Second, Lease: 3 * time.Second, PollInterval: 2 * time.Second}
	a := newNode(t, srv, "trust", cfg)
	b := newNode(t, srv, "trust", cfg)
	ctx := context.Background()
	cycles, polled := 0, 0
	for end := time.Now().Add(8 * time.Second); time.Now().Before(end); cycles++ {
		p, err := b.q.Acquire(ctx, fairqueue.Request{})
		require.NoError(t, err)
		got := make(chan *fairqueue.Permit, 1)
		errs := make(chan error, 1)
		go func() {
			w, err := a.q.Acquire(ctx, fairqueue.Request{})
			errs <- err
			got <- w
		}()
		eventually(t, 10*time.Second, func() bool { return len(readState(t, b.rdb, "trust").Waiting) == 1 }, "a's request never queued")
		p.Release()
		require.NoError(t, <-errs)
		w := <-got
		if w.GrantNo() == 0 {
			polled++
		}
		w.Release()
	}
	t.Logf("polled %d of %d", polled, cycles)
	require.Greater(t, cycles, 10)
	// A message late past 100ms on a loaded machine may lose the race
	// to a reconcile: a few, not most.
	assert.LessOrEqual(t, polled, cycles/4, "grants found by reconcile, not started on their message, of %d", cycles)
}
