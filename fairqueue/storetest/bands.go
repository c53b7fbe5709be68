package storetest

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
)

func init() {
	cases = append(cases,
		testCase{"HighBandRequestOvertakesAManyTenantBacklogWithinOneRound", highBandOvertakes},
	)
}

// reference.md: a high-band request overtakes a low-band backlog after
// at most one request of each tenant waiting. Four tenants wait in band
// 0, three requests each; a band-3 request of a fifth tenant is served
// within the first round (one grant each), before any tenant's second.
func highBandOvertakes(t *testing.T, h Harness) {
	s := store(t, h, "overtake", "n1")
	l := fairqueue.Limits{Permits: 1, Lease: time.Minute}
	c := 0
	next := func(flow string, granted bool) fairqueue.TicketArgs {
		c++
		a := fairT(c, flow, l)
		mustAcquire(t, s, a, granted)
		return a
	}
	holder := next("hhhh.0", true)
	all := []fairqueue.TicketArgs{holder}
	for range 3 {
		for _, f := range []string{"aaaa.0", "bbbb.0", "cccc.0", "dddd.0"} {
			all = append(all, next(f, false))
		}
	}
	z := next("zzzz.3", false)
	all = append(all, z)
	byID := map[string]fairqueue.TicketArgs{}
	for _, a := range all {
		byID[a.ID] = a
	}
	var order []string
	for range 5 {
		require.NoError(t, s.Release(bg, holder))
		_, holders := h.State(t, "overtake")
		require.Len(t, holders, 1)
		holder = byID[holders[0]]
		order = append(order, holder.ID)
	}
	assert.Contains(t, order, z.ID, "the band-3 request is not among the first round's grants: %v", order)
	for _, a := range all {
		require.NoError(t, s.Cancel(bg, a))
	}
	require.NoError(t, s.Leave(bg, "n1", l))
}
