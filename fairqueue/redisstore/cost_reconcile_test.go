package redisstore_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
)

// A reconcile (every node with waiters, each poll) where a tenant holds
// its max_in_flight_per_tenant with requests waiting (their flows are
// left out of the ready set: the normal state under load, nothing
// evicted) does not list every flow with waiters (HKEYS of K.twait:
// O(flows waiting), 50,000 tenants of one waiter each): it lists no more
// hashes than where no tenant is at its cap. Its cost stays about the
// permits held.
func TestAReconcileBesideATenantAtItsCapDoesNotListTheFlowsWaiting(t *testing.T) {
	ctx := context.Background()
	hkeys := map[bool]int64{}
	for _, atCap := range []bool{false, true} {
		rdb, s := openStore(t, "reconcile")
		l := fairqueue.Limits{Permits: 2, Lease: 10 * time.Second, MaxInFlightPerTenant: 2}
		holder := "c"
		if !atCap {
			holder = "h"
		}
		for i := range 2 {
			tenant := holder
			if !atCap {
				tenant = fmt.Sprintf("%s%d", holder, i)
			}
			r, err := s.Acquire(ctx, fairqueue.TicketArgs{ID: fmt.Sprintf("n1:%d:%s.0", i+1, tenant), Node: "n1", Limits: l, Cost: 1})
			require.NoError(t, err)
			require.True(t, r.Granted)
		}
		// Tenant c waits (at its cap when it holds both permits), and 500
		// tenants of one waiter each.
		r, err := s.Acquire(ctx, fairqueue.TicketArgs{ID: "n2:1:c.0", Node: "n2", Limits: l, Cost: 1})
		require.NoError(t, err)
		require.False(t, r.Granted)
		for i := range 500 {
			r, err := s.Acquire(ctx, fairqueue.TicketArgs{ID: fmt.Sprintf("n2:%d:t%d.0", i+2, i), Node: "n2", Limits: l, Cost: 1})
			require.NoError(t, err)
			require.False(t, r.Granted)
		}
		_, _, by := cost(t, rdb, func() {
			_, err := s.Reconcile(ctx, "n1", l)
			require.NoError(t, err)
		})
		t.Logf("tenant at its cap %v: %v", atCap, by)
		hkeys[atCap] = by["hkeys"]
	}
	assert.Equal(t, hkeys[false], hkeys[true], "HKEYS of a reconcile beside a tenant at its cap with waiters, and beside none")
}
