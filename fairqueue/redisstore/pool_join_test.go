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
// one permit each), node n2 not (2 permits, its static upstream, which
// may be a or b), and n2 has just started: its first request queues
// before its first heartbeat (a tick after the join) has named its pool.
// n1's release grants n2's waiter, which runs on n2's static upstream,
// so it must count on every upstream of the pool, as it does once n2's
// heartbeat has named no pool. Placed on a (n2's pool unknown, taken for
// one), it counted there only: once n1's request on b ended, n1 granted
// b beside it, 2 requests on an upstream of 1 permit where n2's static
// upstream is b.
func TestAWaiterOfANodeNotYetBeatingWithoutThePoolCountsOnEveryUpstream(t *testing.T) {
	rdb, s := openStore(t, "pooljoin")
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
	_, err := s.Heartbeat(ctx, fairqueue.HeartbeatArgs{Node: "n1", Limits: pool, Beat: 1})
	require.NoError(t, err)
	r := acquire(n1("1"))
	require.Equal(t, "a:1", r.Upstream)
	r = acquire(n1("2"))
	require.Equal(t, "b:1", r.Upstream)
	r = acquire(n2("1")) // n2 joins with it: no heartbeat of n2 yet
	require.False(t, r.Granted, "n2's first request waits: 2 permits held")

	// n1's release hands its permit on to n2's waiter, which runs on
	// n2's static upstream; then n1's request on b ends.
	require.NoError(t, s.Release(ctx, n1("1")))
	require.ElementsMatch(t, []string{"n1:2", "n2:1"}, readState(t, rdb, "pooljoin").Holders, "n2's waiter granted")
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
