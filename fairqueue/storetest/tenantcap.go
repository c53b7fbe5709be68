package storetest

import (
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
