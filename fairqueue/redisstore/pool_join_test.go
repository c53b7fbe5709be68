package redisstore_test

import (
	"context"
	"testing"

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
	m := newPoolMix(t, "pooljoin")
	_, err := m.s.Heartbeat(context.Background(), fairqueue.HeartbeatArgs{Node: "n1", Limits: m.pool, Beat: 1})
	require.NoError(t, err)
	m.fillBoth(t) // n2 joins with its first request: no heartbeat of n2 yet

	// n1's requests end; the second release hands its permit on to
	// n2's waiter, which runs on n2's static upstream.
	m.handOnToN2(t)

	// n1 may grant nothing while n2:1 runs: it may run on a or on b.
	m.n1GrantsNothingBeside(t)
}
