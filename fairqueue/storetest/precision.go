package storetest

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
)

// Fair order once the virtual time is large, as a long uptime makes it
// (counters are rebased only past 10^9).
func init() {
	cases = append(cases,
		testCase{"TinyCostsKeepFairOrderAtALargeVirtualTime", tinyCostsAtLargeVTime},
	)
}

// A heavy tenant (weight 0.01, 10^6 tokens a request: 10^8 a grant)
// brings the virtual time to 9x10^8. Then tenants A and B, each of
// weight 1000 in band 3 (factor 8), send requests of cost time 10 ms:
// 0.01 / (1000 x 8^3), about 2x10^-8 a grant, less than half the spacing
// of doubles near 9x10^8 (1.2x10^-7). A queues three behind its running
// request, then B one: B must be served after at most one more of A's
// (A's counter moved with each grant), not after A's whole backlog.
func tinyCostsAtLargeVTime(t *testing.T, h Harness) {
	s := store(t, h, "tinycost", "n1")
	l := fairqueue.Limits{Permits: 1, Lease: time.Minute}
	n := 0
	next := func(flow string, cost float64) fairqueue.TicketArgs {
		n++
		a := fairT(n, flow, l)
		a.Cost = cost
		return a
	}
	for range 10 {
		heavy := next("hhhh.0", 1e8)
		mustAcquire(t, s, heavy, true)
		require.NoError(t, s.Release(bg, heavy))
	}
	tiny := 0.01 / (1000 * 8 * 8 * 8)
	a1 := next("aaaa.3", tiny)
	mustAcquire(t, s, a1, true)
	backlog := []fairqueue.TicketArgs{next("aaaa.3", tiny), next("aaaa.3", tiny), next("aaaa.3", tiny)}
	for _, a := range backlog {
		mustAcquire(t, s, a, false)
	}
	b1 := next("bbbb.3", tiny)
	mustAcquire(t, s, b1, false)
	var order []string
	holder := a1
	for range 4 {
		require.NoError(t, s.Release(bg, holder))
		_, holders := h.State(t, "tinycost")
		require.Len(t, holders, 1, "the released permit goes to the next waiter")
		order = append(order, holders[0])
		for _, a := range append(backlog, b1) {
			if a.ID == holders[0] {
				holder = a
			}
		}
	}
	assert.Equal(t, []string{backlog[0].ID, b1.ID, backlog[1].ID, backlog[2].ID}, order,
		"B is served after one more of A's, as at a small virtual time")
	require.NoError(t, s.Release(bg, holder))
	require.NoError(t, s.Leave(bg, "n1", l))
}
