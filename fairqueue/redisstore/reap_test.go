package redisstore_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
)

// The scripts reap expired leases only where they keep a grant out (and
// in reconcile): a crashed node's permits still come back at the next
// acquire that finds no room, whether the permits, an upstream's permits
// or the tenant's max_in_flight are what its holders take.
func TestExpiredLeasesAreReapedWhenTheyKeepAGrantOut(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name   string
		limits fairqueue.Limits
		flow   string // ":<tenant>.<band>" for a fair ticket
	}{
		{name: "permits", limits: fairqueue.Limits{Permits: 2}},
		{name: "pool", limits: fairqueue.Limits{Permits: 4, Upstreams: []fairqueue.Upstream{{Dial: "a:1", Permits: 1}, {Dial: "b:1", Permits: 1}}}},
		{name: "tenant cap", limits: fairqueue.Limits{Permits: 4, MaxInFlightPerTenant: 2}, flow: ":t.0"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, s := openStore(t, "reap")
			n := 0
			tk := func(node string, lease time.Duration) fairqueue.TicketArgs {
				n++
				l := tc.limits
				l.Lease = lease
				return fairqueue.TicketArgs{ID: fmt.Sprintf("%s:%d%s", node, n, tc.flow), Node: node, Limits: l, Cost: 1}
			}
			// The crashed node takes 2 permits on a short lease and is gone.
			for range 2 {
				r, err := s.Acquire(ctx, tk("dead", 200*time.Millisecond))
				require.NoError(t, err)
				require.True(t, r.Granted)
			}
			r, err := s.Acquire(ctx, tk("n1", 10*time.Second))
			require.NoError(t, err)
			require.False(t, r.Granted, "no room while the leases run")
			time.Sleep(300 * time.Millisecond)
			// A waiter was queued meanwhile: this acquire finds the queue
			// busy and dispatches to it; the next one is served at once
			// too, the permits the dead node held being back.
			w := tk("n1", 10*time.Second)
			r, err = s.Acquire(ctx, w)
			require.NoError(t, err)
			require.True(t, r.Granted, "acquire after the dead node's leases ended")
			require.NoError(t, s.Purge(ctx))

			for range 2 {
				r, err := s.Acquire(ctx, tk("dead", 200*time.Millisecond))
				require.NoError(t, err)
				require.True(t, r.Granted)
			}
			time.Sleep(300 * time.Millisecond)
			r, err = s.Acquire(ctx, tk("n1", 10*time.Second))
			require.NoError(t, err)
			require.True(t, r.Granted, "fast path after the dead node's leases ended")
		})
	}
}

// Every acquire reports the data set's epoch (set by the first call to
// find it missing); a data set flushed or lost (restart without
// persistence) has a new one, which the next acquire of each node
// reports.
func TestAcquireReportsANewEpochAfterAFlush(t *testing.T) {
	ctx := context.Background()
	rdb, s := openStore(t, "epoch")
	l := fairqueue.Limits{Permits: 4, Lease: 10 * time.Second}
	a := fairqueue.TicketArgs{ID: "n1:1", Node: "n1", Limits: l}
	r, err := s.Acquire(ctx, a)
	require.NoError(t, err)
	first := r.Epoch
	require.NotEmpty(t, first, "a node's first acquire learns the epoch")
	require.NoError(t, s.Release(ctx, a))
	r, err = s.Acquire(ctx, fairqueue.TicketArgs{ID: "n1:2", Node: "n1", Limits: l})
	require.NoError(t, err)
	require.Equal(t, first, r.Epoch, "an alive node's acquire: the same data set")

	require.NoError(t, rdb.FlushAll(ctx).Err())
	r, err = s.Acquire(ctx, fairqueue.TicketArgs{ID: "n1:3", Node: "n1", Limits: l})
	require.NoError(t, err)
	require.NotEmpty(t, r.Epoch)
	require.NotEqual(t, first, r.Epoch, "the flushed data set has a new epoch")
	second := r.Epoch
	r, err = s.Acquire(ctx, fairqueue.TicketArgs{ID: "n2:1", Node: "n2", Limits: l})
	require.NoError(t, err)
	require.Equal(t, second, r.Epoch, "another node joining learns the same one")
}
