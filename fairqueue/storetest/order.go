package storetest

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
)

// Order promises of fair queueing, driven call by call on the Store so
// both stores must grant in the same order.
func init() {
	cases = append(cases,
		testCase{"NewFlowStartsAtTheLeastReadyCounterNotACappedTenants", floorSkipsCapped},
		testCase{"CappedTenantsPositionCountsItsOwnTurnInEachRound", cappedPosition},
	)
}

// fairT is a fair ticket of node n1 numbered c in flow with cost 1.
func fairT(c int, flow string, l fairqueue.Limits) fairqueue.TicketArgs {
	id := fairqueue.TicketID{Node: "n1", Counter: uint64(c), Flow: flow}.String()
	return fairqueue.TicketArgs{ID: id, Node: "n1", Limits: l, Cost: 1}
}

func mustAcquire(t *testing.T, s fairqueue.Store, a fairqueue.TicketArgs, granted bool) fairqueue.AcquireResult {
	t.Helper()
	res, err := s.Acquire(bg, a)
	require.NoError(t, err)
	require.Equal(t, granted, res.Granted, "acquire %s granted", a.ID)
	return res
}

// A flow that becomes active starts at the least counter of the READY
// flows: a flow whose tenant holds its max_in_flight_per_tenant is not
// ready (design.md). Tenant T's band 1 waits at counter 0 while T holds
// its cap through band 0; U waits, ready, at counter 2. A new flow Z
// must start at 2 (U's counter), not at T.1's 0, so U (arrived first)
// is served before Z.
func floorSkipsCapped(t *testing.T, h Harness) {
	s := store(t, h, "floorcap", "n1")
	l := fairqueue.Limits{Permits: 2, Lease: time.Minute, MaxInFlightPerTenant: 1}
	u1 := fairT(1, "uuuu.0", l)
	mustAcquire(t, s, u1, true) // U: 1
	h1 := fairT(2, "hhhh.0", l)
	mustAcquire(t, s, h1, true) // full
	t0 := fairT(3, "tttt.0", l)
	mustAcquire(t, s, t0, false) // T.0 at 0
	t1 := fairT(4, "tttt.1", l)
	mustAcquire(t, s, t1, false) // T.1 at 0
	u2 := fairT(5, "uuuu.0", l)
	mustAcquire(t, s, u2, false) // U capped (holds u1)
	u1.Correction = 1
	require.NoError(t, s.Release(bg, u1)) // U at 2, ready; T.0 (0) served: T at its cap
	_, holders := h.State(t, "floorcap")
	require.ElementsMatch(t, []string{h1.ID, t0.ID}, holders, "T.0 served first, T now at its cap")
	z1 := fairT(6, "zzzz.0", l)
	mustAcquire(t, s, z1, false)
	require.NoError(t, s.Release(bg, h1))
	_, holders = h.State(t, "floorcap")
	assert.ElementsMatch(t, []string{t0.ID, u2.ID}, holders, "U (counter 2, arrived first) before the newcomer Z, which starts at the least ready counter")
	for _, a := range []fairqueue.TicketArgs{t0, t1, u2, z1} {
		require.NoError(t, s.Cancel(bg, a))
	}
	require.NoError(t, s.Leave(bg, "n1", l))
}

// A waiter's position counts each request ahead in its own flow as one
// round of all the flows waiting (design.md, "What a client sees"),
// its own flow included, also while its tenant is at its cap. T holds
// the one permit (cap 1) and queues t2 and t3; A and B queue three each
// at a lower counter. t3's estimate: one ahead in its flow x 3 flows +
// the 2 flows ahead of T + 1 = 6 (the in-process store says 6; the
// grants before t3 are in fact seven: a1, b1, t2, a2, b2, a3, b3).
func cappedPosition(t *testing.T, h Harness) {
	s := store(t, h, "cappos", "n1")
	l := fairqueue.Limits{Permits: 1, Lease: time.Minute, MaxInFlightPerTenant: 1}
	c := 0
	next := func(flow string, granted bool) (fairqueue.TicketArgs, fairqueue.AcquireResult) {
		c++
		a := fairT(c, flow, l)
		return a, mustAcquire(t, s, a, granted)
	}
	var all []fairqueue.TicketArgs
	t1, _ := next("tttt.0", true)
	t2, _ := next("tttt.0", false)
	all = append(all, t1, t2)
	for range 3 {
		a, _ := next("aaaa.0", false)
		b, _ := next("bbbb.0", false)
		all = append(all, a, b)
	}
	t3, res := next("tttt.0", false)
	all = append(all, t3)
	assert.Equal(t, 6, res.Position, "t3's position: a1, b1, t2, a2, b2 go first")
	byID := map[string]fairqueue.TicketArgs{}
	for _, a := range all {
		byID[a.ID] = a
	}
	var order []string
	holder := t1
	for range 8 {
		require.NoError(t, s.Release(bg, holder))
		_, holders := h.State(t, "cappos")
		require.Len(t, holders, 1)
		holder = byID[holders[0]]
		order = append(order, holder.ID[len("n1:"):])
	}
	require.Equal(t, []string{"3:aaaa.0", "4:bbbb.0", "2:tttt.0", "5:aaaa.0", "6:bbbb.0", "7:aaaa.0", "8:bbbb.0", "9:tttt.0"}, order, "grant order")
	for _, a := range all {
		require.NoError(t, s.Cancel(bg, a))
	}
	require.NoError(t, s.Leave(bg, "n1", l))
}
