package redisstore_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
)

// A rolling change that adds a pool: node n1 has it (two upstreams of
// one permit each), node n2 not (2 permits, its static upstream, which
// may be a or b). Redis loses the queue's record of the nodes' pools
// (K.upool: an eviction under maxmemory deletes the key, nothing else
// tells) while both are alive; until their next heartbeats nobody's pool
// is known. n1's release grants n2's waiter, which runs on n2's static
// upstream: a node whose pool is not known may be one without it, so the
// grant must count on every upstream, as pool_forget already takes such
// a node to use any upstream. Placed on a (an unknown pool taken for
// one), it counted there only: once n1's request on b ended, n1 granted
// b beside it, 2 requests on an upstream of 1 permit where n2's static
// upstream is b.
func TestAWaiterOfANodeWhosePoolRedisLostCountsOnEveryUpstream(t *testing.T) {
	m := newPoolMix(t, "poollost")
	ctx := context.Background()
	for n, l := range map[string]fairqueue.Limits{"n1": m.pool, "n2": m.plain} {
		_, err := m.s.Heartbeat(ctx, fairqueue.HeartbeatArgs{Node: n, Limits: l, Beat: 1})
		require.NoError(t, err)
	}
	m.fillBoth(t)
	require.NoError(t, m.rdb.Del(ctx, m.s.Tag()+":upool").Err()) // evicted

	// n1's requests end; the second release hands its permit on to
	// n2's waiter, which runs on n2's static upstream.
	m.handOnToN2(t)

	// n1 may grant nothing while n2:1 runs: it may run on a or on b.
	m.n1GrantsNothingBeside(t)
}
