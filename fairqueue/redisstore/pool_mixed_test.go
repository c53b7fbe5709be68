package redisstore_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
)

// A rolling change that adds a pool: node n1 has it (two upstreams of
// one permit each), node n2 not yet (2 permits, its static upstream).
// n1 grants n2's waiter on upstream a; n2 releases it, and its next
// request runs on no upstream the store chose, so it counts on every
// upstream of n1's pool. The entry that placed n2's first request on a
// went with its release: it was left behind by n2, which has no pool,
// and made n1 count n2's running request on a only, so n1 granted b
// beside it: 2 requests on an upstream of 1 permit (n2's static
// upstream may be b).
func TestANodeWithoutThePoolLeavesNoUpstreamEntryBehind(t *testing.T) {
	rdb, s := openStore(t, "poolmix")
	ctx := context.Background()
	pool := fairqueue.Limits{Permits: 2, Lease: 10 * time.Second,
		Upstreams: []fairqueue.Upstream{{Dial: "a:1", Permits: 1}, {Dial: "b:1", Permits: 1}}}
	plain := fairqueue.Limits{Permits: 2, Lease: 10 * time.Second}
	n1 := func(id string) fairqueue.TicketArgs {
		return fairqueue.TicketArgs{ID: "n1:" + id, Node: "n1", Limits: pool, Cost: 1}
	}
	n2 := func(id string) fairqueue.TicketArgs {
		return fairqueue.TicketArgs{ID: "n2:" + id, Node: "n2", Limits: plain, Cost: 1}
	}
	acquire := func(a fairqueue.TicketArgs) fairqueue.AcquireResult {
		r, err := s.Acquire(ctx, a)
		require.NoError(t, err)
		return r
	}
	r := acquire(n1("1"))
	require.Equal(t, "a:1", r.Upstream)
	r = acquire(n1("2"))
	require.Equal(t, "b:1", r.Upstream)
	r = acquire(n2("1"))
	require.False(t, r.Granted, "n2's first request waits: 2 permits held")

	// n1's release hands a on to n2's waiter; n1's second ends too.
	require.NoError(t, s.Release(ctx, n1("1")))
	held := readState(t, rdb, "poolmix").Holders
	require.ElementsMatch(t, []string{"n1:2", "n2:1"}, held, "n2's waiter granted")
	require.NoError(t, s.Release(ctx, n1("2")))

	// n2 (no pool) ends its request and starts another, on its static
	// upstream: it may run on a or b.
	require.NoError(t, s.Release(ctx, n2("1")))
	r = acquire(n2("2"))
	require.True(t, r.Granted)
	require.Empty(t, r.Upstream, "n2 has no pool")

	// n1 may grant nothing: n2's request counts on a and on b.
	r = acquire(n1("3"))
	assert.False(t, r.Granted, "n1 granted %q beside n2's request that may run there: 2 requests on an upstream of 1 permit", r.Upstream)
	uheld, err := rdb.HGetAll(ctx, s.Tag()+":uheld").Result()
	require.NoError(t, err)
	assert.NotContains(t, uheld, "n2:1", "the entry of n2's ended request is left")
}

// A rolling change that adds a pool: node n1 has it (two upstreams of
// one permit each), node n2 not yet (2 permits, its static upstream,
// which may be a or b). n1's release grants n2's waiter while it runs:
// n2 has no pool, so its request runs on its static upstream, not on the
// upstream n1's dispatch would have chosen, and must count on every
// upstream of the pool, as one n2 granted itself does. Placed on a, it
// counted there only: once n1's request on b ended, n1 granted b beside
// it, 2 requests on an upstream of 1 permit where n2's static upstream is
// b.
func TestAWaiterOfANodeWithoutThePoolGrantedByOneWithItCountsOnEveryUpstream(t *testing.T) {
	rdb, s := openStore(t, "poolmixgrant")
	ctx := context.Background()
	pool := fairqueue.Limits{Permits: 2, Lease: 10 * time.Second,
		Upstreams: []fairqueue.Upstream{{Dial: "a:1", Permits: 1}, {Dial: "b:1", Permits: 1}}}
	plain := fairqueue.Limits{Permits: 2, Lease: 10 * time.Second}
	n1 := func(id string) fairqueue.TicketArgs {
		return fairqueue.TicketArgs{ID: "n1:" + id, Node: "n1", Limits: pool, Cost: 1}
	}
	n2 := func(id string) fairqueue.TicketArgs {
		return fairqueue.TicketArgs{ID: "n2:" + id, Node: "n2", Limits: plain, Cost: 1}
	}
	acquire := func(a fairqueue.TicketArgs) fairqueue.AcquireResult {
		r, err := s.Acquire(ctx, a)
		require.NoError(t, err)
		return r
	}
	for i, l := range map[string]fairqueue.Limits{"n1": pool, "n2": plain} {
		_, err := s.Heartbeat(ctx, fairqueue.HeartbeatArgs{Node: i, Limits: l, Beat: 1})
		require.NoError(t, err)
	}
	r := acquire(n1("1"))
	require.Equal(t, "a:1", r.Upstream)
	r = acquire(n1("2"))
	require.Equal(t, "b:1", r.Upstream)
	r = acquire(n2("1"))
	require.False(t, r.Granted, "n2's first request waits: 2 permits held")

	// n1's release hands its permit on to n2's waiter, which runs on
	// n2's static upstream; then n1's request on b ends.
	require.NoError(t, s.Release(ctx, n1("1")))
	require.ElementsMatch(t, []string{"n1:2", "n2:1"}, readState(t, rdb, "poolmixgrant").Holders, "n2's waiter granted")
	require.NoError(t, s.Release(ctx, n1("2")))

	// n1 may grant nothing while n2:1 runs: it may run on a or on b.
	r = acquire(n1("3"))
	assert.False(t, r.Granted, "n1 granted %q beside n2's request that may run there: 2 requests on an upstream of 1 permit", r.Upstream)
	if r.Granted {
		require.NoError(t, s.Release(ctx, n1("3")))
	} else {
		require.NoError(t, s.Cancel(ctx, n1("3")))
	}
	require.NoError(t, s.Release(ctx, n2("1")))
	require.NoError(t, s.Leave(ctx, "n1", pool))
	require.NoError(t, s.Leave(ctx, "n2", plain))
	assert.Empty(t, rdb.Keys(ctx, s.Tag()+"*").Val())
}
