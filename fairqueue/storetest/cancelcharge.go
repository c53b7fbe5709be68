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
		testCase{"CancelOfAGrantedTicketTakesBackItsCharge", cancelTakesBackCharge},
	)
}

// A cancel that finds its ticket granted (the grant raced the client's
// leaving, a max_wait or a drain: the node cancels a ticket it never
// started) hands the permit on, and its Correction, minus the ticket's
// cost, takes the grant's charge back: the request ran nowhere. Tenant
// l's request of cost 5 is granted, then cancelled; its next request,
// behind three of tenant o, is served level with o's: after o's first,
// not after all three.
func cancelTakesBackCharge(t *testing.T, h Harness) {
	s := store(t, h, "cancelcharge", "n1")
	l := fairqueue.Limits{Permits: 1, Lease: time.Minute}
	c := 0
	next := func(flow string, cost float64, granted bool) fairqueue.TicketArgs {
		c++
		a := fairT(c, flow, l)
		a.Cost = cost
		mustAcquire(t, s, a, granted)
		return a
	}
	gone := next("llll.0", 5, true)
	gone.Correction = -gone.Cost
	require.NoError(t, s.Cancel(bg, gone))
	_, holders := h.State(t, "cancelcharge")
	require.Empty(t, holders, "the cancel handed the permit back")

	holder := next("hhhh.0", 1, true)
	all := []fairqueue.TicketArgs{holder}
	for range 3 {
		all = append(all, next("oooo.0", 1, false))
	}
	all = append(all, next("llll.0", 1, false))
	byID := map[string]fairqueue.TicketArgs{}
	for _, a := range all {
		byID[a.ID] = a
	}
	var order []string
	for range 2 {
		require.NoError(t, s.Release(bg, holder))
		_, holders := h.State(t, "cancelcharge")
		require.Len(t, holders, 1)
		holder = byID[holders[0]]
		order = append(order, fairqueue.TicketFlow(holder.ID))
	}
	assert.Equal(t, []string{"oooo.0", "llll.0"}, order, "l is charged nothing for the grant it never used")
	for _, a := range all {
		require.NoError(t, s.Cancel(bg, a))
	}
	require.NoError(t, s.Leave(bg, "n1", l))
}
