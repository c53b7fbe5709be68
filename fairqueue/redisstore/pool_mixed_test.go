package redisstore_test

import (
	"context"
	"testing"

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
	m := newPoolMix(t, "poolmix")
	ctx := context.Background()
	m.fillBoth(t)

	// n1's requests end; the second release hands on to n2's waiter.
	m.handOnToN2(t)

	// n2 (no pool) ends its request and starts another, on its static
	// upstream: it may run on a or b.
	require.NoError(t, m.s.Release(ctx, m.n2("1")))
	r := m.acquire(t, m.n2("2"))
	require.True(t, r.Granted)
	require.Empty(t, r.Upstream, "n2 has no pool")

	// n1 may grant nothing: n2's request counts on a and on b.
	r = m.acquire(t, m.n1("3"))
	assert.False(t, r.Granted, "n1 granted %q beside n2's request that may run there: 2 requests on an upstream of 1 permit", r.Upstream)
	uheld, err := m.rdb.HGetAll(ctx, m.s.Tag()+":uheld").Result()
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
	m := newPoolMix(t, "poolmixgrant")
	for i, l := range map[string]fairqueue.Limits{"n1": m.pool, "n2": m.plain} {
		_, err := m.s.Heartbeat(context.Background(), fairqueue.HeartbeatArgs{Node: i, Limits: l, Beat: 1})
		require.NoError(t, err)
	}
	m.fillBoth(t)

	// n1's requests end; the second release hands its permit on to
	// n2's waiter, which runs on n2's static upstream.
	m.handOnToN2(t)

	// n1 may grant nothing while n2:1 runs: it may run on a or on b.
	m.n1GrantsNothingBeside(t)
}
