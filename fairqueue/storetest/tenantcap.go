package storetest

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
)

// The tenant cap (max_in_flight_per_tenant) as a reload changes it.
func init() {
	cases = append(cases,
		testCase{"RaisedTenantCapServesTheTenantsWaitersAtOnce", raisedTenantCap},
		testCase{"NewFlowAfterALoweredCapStartsAtTheLeastReadyCounter", loweredCapFloor},
		testCase{"RaisedTenantCapServesTheOtherBandAfterTheTenantsLastRelease", raisedCapLastRelease},
	)
}

// A reload that raises max_in_flight_per_tenant (or removes it) lets
// the tenant's waiters take the free permits at the next reconcile: they
// do not wait for one of its running requests to end. T holds 1 of 3
// permits under a cap of 1, and two of its requests wait (one per band);
// under a cap of 3 both are served by the next reconcile.
func raisedTenantCap(t *testing.T, h Harness) {
	s := store(t, h, "capraise", "n1")
	l := fairqueue.Limits{Permits: 3, Lease: time.Minute, MaxInFlightPerTenant: 1}
	t1 := fairT(1, "tttt.0", l)
	mustAcquire(t, s, t1, true)
	t2 := fairT(2, "tttt.0", l)
	mustAcquire(t, s, t2, false)
	t3 := fairT(3, "tttt.1", l)
	mustAcquire(t, s, t3, false)

	l.MaxInFlightPerTenant = 3 // the reload
	_, err := s.Reconcile(bg, "n1", l)
	require.NoError(t, err)
	waiting, holders := h.State(t, "capraise")
	assert.Empty(t, waiting, "T's waiters under the raised cap")
	assert.ElementsMatch(t, []string{t1.ID, t2.ID, t3.ID}, holders, "two permits free, T under its new cap")

	for _, a := range []fairqueue.TicketArgs{t1, t2, t3} {
		a.Limits = l
		require.NoError(t, s.Cancel(bg, a))
	}
	require.NoError(t, s.Leave(bg, "n1", l))
}

// A reload that lowers max_in_flight_per_tenant makes a tenant that
// waits and holds the new cap not ready at once: a flow that becomes
// active then starts at the least counter of the flows still ready, not
// at the capped tenant's. U used 5 and waits (ready, counter 5); T holds
// 1 and waits at counter 1; the cap goes from 3 to 1. Z, new, starts at
// U's 5 and is served after U, which arrived first.
func loweredCapFloor(t *testing.T, h Harness) {
	s := store(t, h, "caplower", "n1")
	l := fairqueue.Limits{Permits: 3, Lease: time.Minute, MaxInFlightPerTenant: 3}
	u1 := fairT(1, "uuuu.0", l)
	u1.Cost = 5
	mustAcquire(t, s, u1, true)
	require.NoError(t, s.Release(bg, u1)) // U idle at 5
	t1 := fairT(2, "tttt.0", l)
	mustAcquire(t, s, t1, true)
	x1 := fairT(3, "xxxx.0", l)
	mustAcquire(t, s, x1, true)
	y1 := fairT(4, "yyyy.0", l)
	mustAcquire(t, s, y1, true) // full
	u2 := fairT(5, "uuuu.0", l)
	mustAcquire(t, s, u2, false) // U at 5
	t2 := fairT(6, "tttt.0", l)
	mustAcquire(t, s, t2, false) // T at 1

	l.MaxInFlightPerTenant = 1 // the reload: T, holding t1, is at its cap
	z1 := fairT(7, "zzzz.0", l)
	mustAcquire(t, s, z1, false)
	x1.Limits = l
	require.NoError(t, s.Release(bg, x1))
	_, holders := h.State(t, "caplower")
	assert.ElementsMatch(t, []string{t1.ID, y1.ID, u2.ID}, holders, "U (counter 5, arrived first) before the newcomer Z")

	for _, a := range []fairqueue.TicketArgs{t1, y1, u2, t2, z1} {
		a.Limits = l
		require.NoError(t, s.Cancel(bg, a))
	}
	require.NoError(t, s.Leave(bg, "n1", l))
}

// A reload that raises or lifts max_in_flight_per_tenant, followed by
// the release of the tenant's last permit before any reconcile, leaves
// no waiter of the tenant behind: its other band, not ready while the
// old cap held, is served (at the release, or at the latest by the next
// reconcile) although the tenant then holds nothing. T holds 1 of 3
// permits under a cap of 1 through band 0, and its band-1 request
// waits; the cap goes to 2 (or 0: none), T's permit ends.
func raisedCapLastRelease(t *testing.T, h Harness) {
	for _, raised := range []int{2, 0} {
		name := fmt.Sprintf("caprelease%d", raised)
		s := store(t, h, name, "n1")
		l := fairqueue.Limits{Permits: 3, Lease: time.Minute, MaxInFlightPerTenant: 1}
		t1 := fairT(1, "tttt.0", l)
		mustAcquire(t, s, t1, true)
		t2 := fairT(2, "tttt.1", l)
		mustAcquire(t, s, t2, false)

		l.MaxInFlightPerTenant = raised // the reload
		t1.Limits = l
		require.NoError(t, s.Release(bg, t1))
		_, err := s.Reconcile(bg, "n1", l)
		require.NoError(t, err)
		waiting, holders := h.State(t, name)
		assert.Empty(t, waiting, "cap %d: T's band-1 request, with T holding nothing and 2 permits free", raised)
		assert.Equal(t, []string{t2.ID}, holders, "cap %d", raised)

		t2.Limits = l
		require.NoError(t, s.Cancel(bg, t2))
		require.NoError(t, s.Leave(bg, "n1", l))
	}
}
