package redisstore_test

import (
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
)

// rollbackTenantCfg is rollbackCfg in fair order with two permits, one
// tenant holding at most one of them.
var rollbackTenantCfg = fairqueue.Config{Permits: 2, Fair: true, MaxInFlightPerTenant: 1, MaxWait: 10 * time.Second,
	PollInterval: 100 * time.Millisecond, Lease: 30 * time.Second}

// A grant a failover lost, of tenant x at its max_in_flight_per_tenant
// (1), counts for x again at the resubscribe: x's next request (of
// another node) waits while a permit is free, and tenant y's is served
// meanwhile; x's is served once its first ends.
func TestLostTenantGrantCountsForItsTenantAgain(t *testing.T) {
	s := warmScene(t, "lost-tenant-grant", rollbackTenantCfg)
	a, b, ctx := s.a, s.b, s.ctx

	rollback := snapshot(t, s.admin)
	held, err := a.q.Acquire(ctx, fairqueue.Request{Tenant: "x"}) // the grant: lost
	require.NoError(t, err)
	rollback(func() { require.Empty(t, s.state(t).Holders, "the rollback lost x's grant") })
	s.holding(t, 1, "x's request is not counted again")
	second := acquireReq(b, ctx, fairqueue.Request{Tenant: "x"})
	stillWaiting(t, second, "x's second request started beside its first: 2 in flight, max_in_flight_per_tenant 1")
	y, err := b.q.Acquire(ctx, fairqueue.Request{Tenant: "y"})
	require.NoError(t, err, "y's request, on the permit x may not take")
	held.Release()
	served(t, second, "x's second request")
	y.Release()
	s.leave(t)
}

// A release a failover lost, of tenant x at its max_in_flight_per_tenant,
// neither holds the permit nor keeps x at its cap: x's next request, of
// another node, is served within its max wait (far shorter than the
// lease).
func TestLostTenantReleaseFreesItsTenant(t *testing.T) {
	s := warmScene(t, "lost-tenant-release", rollbackTenantCfg)
	a, b, ctx := s.a, s.b, s.ctx

	held, err := a.q.Acquire(ctx, fairqueue.Request{Tenant: "x"})
	require.NoError(t, err)
	rollback := snapshot(t, s.admin)
	held.Release() // the release: lost
	s.holding(t, 0, "the release never reached Redis")
	rollback(func() { require.Len(t, s.state(t).Holders, 1, "the rollback brought x's permit back") })
	served(t, acquireReq(b, ctx, fairqueue.Request{Tenant: "x"}), "x's next request", "x's next request, its lost release released again")
	s.leave(t)
}

// Waiters of the highest priority band a failover lost (their acquires)
// are queued again in their band: queued again behind three waiters of
// tenant l in band 0, tenant p's two are served one after the other as
// soon as l's first is (a band 0 flow would take turns with l).
func TestLostPriorityWaitersKeepTheirBand(t *testing.T) {
	cfg := rollbackCfg
	cfg.Fair = true
	s := warmScene(t, "lost-priority", cfg)
	a, b, ctx := s.a, s.b, s.ctx

	held, err := a.q.Acquire(ctx, fairqueue.Request{Tenant: "h"})
	require.NoError(t, err)
	granted := make(chan acquired, 5)
	tenants := make(map[*fairqueue.Permit]string)
	var mu sync.Mutex
	queue := func(n *node, tenant string, priority, waiting int) {
		go func() {
			p, err := n.q.Acquire(ctx, fairqueue.Request{Tenant: tenant, Priority: priority})
			mu.Lock()
			tenants[p] = tenant
			mu.Unlock()
			granted <- acquired{p: p, err: err}
		}()
		s.waiting(t, waiting, tenant+" never queued")
	}
	for i := range 3 {
		queue(a, "l", 0, i+1)
	}
	rollback := snapshot(t, s.admin)
	for i := range 2 { // lost
		queue(b, "p", fairqueue.MaxPriority, 4+i)
	}
	rollback(func() { require.Len(t, s.state(t).Waiting, 3, "the rollback lost p's waiters") })
	s.waiting(t, 5, "p's waiters were not queued again")
	held.Release()
	var order []string
	for range 5 {
		var r acquired
		select {
		case r = <-granted:
		case <-time.After(cfg.MaxWait + 5*time.Second):
			t.Fatalf("a waiter never returned; served: %v", order)
		}
		require.NoError(t, r.err, "served: %v", order)
		mu.Lock()
		order = append(order, tenants[r.p])
		mu.Unlock()
		r.p.Release()
	}
	assert.Equal(t, []string{"l", "p", "p", "l", "l"}, order, "p's waiters, queued again, are of band %d", fairqueue.MaxPriority)
	s.leave(t)
}
