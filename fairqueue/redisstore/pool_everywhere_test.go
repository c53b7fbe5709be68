package redisstore_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
)

// A rolling change that adds a pool: node n1 has it (two upstreams of
// one permit each), node n2 not yet, with 1 permit (no more than the
// smallest upstream's, as docs/pools.md advises until every node has the
// pool): n2's request runs on its static upstream, a or b. n1's release
// of its request on a leaves b running n1:2; n2's waiter, which counts
// on every upstream once granted, must wait until b has room too: n1
// granted it at once, counted on a and on b, and b ran 2 requests of 1
// permit where n2's static upstream is b. n2 itself, with 1 permit held,
// would not have granted it.
func TestAWaiterOfANodeWithoutThePoolWaitsForRoomOnEveryUpstream(t *testing.T) {
	m := newPoolMix(t, "poolevery")
	m.plain = noTokens(1)
	ctx := context.Background()
	for n, l := range map[string]fairqueue.Limits{"n1": m.pool, "n2": m.plain} {
		_, err := m.s.Heartbeat(ctx, fairqueue.HeartbeatArgs{Node: n, Limits: l, Beat: 1})
		require.NoError(t, err)
	}
	m.fillBoth(t)

	require.NoError(t, m.s.Release(ctx, m.n1("1")))
	assert.Equal(t, []string{"n1:2"}, readState(t, m.rdb, m.name).Holders,
		"n2's waiter granted while b runs n1:2: it may run on b, 2 requests on an upstream of 1 permit")

	// b's request ends: every upstream has room, n2's waiter runs.
	require.NoError(t, m.s.Release(ctx, m.n1("2")))
	require.ElementsMatch(t, []string{"n2:1"}, readState(t, m.rdb, m.name).Holders, "n2's waiter granted")
	m.n1GrantsNothingBeside(t)
}
