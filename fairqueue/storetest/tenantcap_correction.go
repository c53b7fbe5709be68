package storetest

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
)

// A release's correction while the tenant holds its cap, the cap lowered
// by a reload (or carried by an instance not reloaded yet, in a rolling
// change): the flow is served by its corrected counter once the tenant
// may be served again.
func init() {
	cases = append(cases,
		testCase{"CorrectionWhileCappedCountsOnceTheCapIsRaised", cappedCorrection},
	)
}

// B holds 3 of 3 permits (b2 charged 3, the others 1) and waits with
// b3; A waits with a1 at counter 2. The cap goes from none to 2: b2's
// request ends having used nothing (correction -3), B still holds its
// cap, so a1 takes the permit (A at 3) and a2 waits behind it. The cap
// is lifted again; a1's request ends. B's counter is 2 (3 requests
// charged 5, 3 given back), A's 3: b3 is served first. The Redis store
// kept B's ready entry at the counter it had before the correction (5)
// while B was capped, and served a2 first.
func cappedCorrection(t *testing.T, h Harness) {
	s := store(t, h, "capcorrect", "n1")
	l := fairqueue.Limits{Permits: 3, Lease: time.Minute}
	b1 := fairT(1, "bbbb.0", l)
	mustAcquire(t, s, b1, true)
	bx := fairT(2, "bbbb.0", l)
	mustAcquire(t, s, bx, true)
	b2 := fairT(3, "bbbb.0", l)
	b2.Cost = 3
	mustAcquire(t, s, b2, true) // B at 5, the virtual time at 2
	a1 := fairT(4, "aaaa.0", l)
	mustAcquire(t, s, a1, false) // A starts at 2
	b3 := fairT(5, "bbbb.0", l)
	mustAcquire(t, s, b3, false)

	l.MaxInFlightPerTenant = 2 // the reload: B, holding b1 and bx, is at its cap
	b2.Limits = l
	b2.Correction = -b2.Cost
	require.NoError(t, s.Release(bg, b2)) // B at 2, capped: a1 is served
	_, holders := h.State(t, "capcorrect")
	require.ElementsMatch(t, []string{b1.ID, bx.ID, a1.ID}, holders, "B holds its cap: a1 takes the free permit")
	a2 := fairT(6, "aaaa.0", l)
	mustAcquire(t, s, a2, false) // A at 3

	l.MaxInFlightPerTenant = 0 // the next reload lifts the cap
	_, err := s.Reconcile(bg, "n1", l)
	require.NoError(t, err)
	a1.Limits = l
	require.NoError(t, s.Release(bg, a1))
	waiting, holders := h.State(t, "capcorrect")
	assert.ElementsMatch(t, []string{b1.ID, bx.ID, b3.ID}, holders, "B (counter 2) before A (counter 3)")
	assert.Equal(t, []string{a2.ID}, waiting)

	for _, a := range []fairqueue.TicketArgs{b1, bx, b3, a2} {
		a.Limits = l
		require.NoError(t, s.Cancel(bg, a))
	}
	require.NoError(t, s.Leave(bg, "n1", l))
}
