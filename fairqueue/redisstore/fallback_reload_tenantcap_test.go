package redisstore_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
	"github.com/fair-queue/caddy-fair-queue/fairqueue/memstore"
	"github.com/fair-queue/caddy-fair-queue/internal/redistest"
)

// Local fallback, a reload during the outage that lowers
// max_in_flight_per_tenant and nothing of the capacity: the fallback
// queue keeps the tenant to the new cap, as Redis' queue would. It took
// the reload only where the permits, kv_tokens or the pool changed: a
// tenant of max_in_flight_per_tenant 2 lowered to 1 ran 2 at once.
func TestLocalFallbackKeepsATenantToTheCapOfTheReload(t *testing.T) {
	t.Parallel() // its own redis-server: it waits on it, not on the CPU
	srv := redistest.Start(t)
	cfg := fairqueue.Config{Permits: 4, LocalPermits: 4, Fair: true, MaxInFlightPerTenant: 2, Fallback: memstore.New(),
		Lease: 1500 * time.Millisecond, PollInterval: 50 * time.Millisecond, MaxWait: 10 * time.Second}
	n := newNode(t, srv, "fbreloadcap", cfg)
	p, err := n.q.Acquire(context.Background(), fairqueue.Request{Tenant: "t"})
	require.NoError(t, err)
	p.Release()
	srv.Kill()
	first, err := n.q.Acquire(context.Background(), fairqueue.Request{Tenant: "t"})
	require.NoError(t, err)
	require.True(t, first.Local(), "the request during the outage was not served by the fallback queue")
	defer first.Release()

	cfg.MaxInFlightPerTenant = 1
	require.NoError(t, n.q.Reconfigure(cfg))
	queued := make(chan struct{}, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	second, err := n.q.Acquire(ctx, fairqueue.Request{Tenant: "t", OnQueued: func(fairqueue.Waiting) {
		select {
		case queued <- struct{}{}:
		default:
		}
		cancel() // it waits for the tenant's first to end: enough seen
	}})
	if err == nil {
		second.Release()
	}
	select {
	case <-queued:
	default:
		t.Fatalf("the tenant's second request was served beside its first on max_in_flight_per_tenant 1 (err %v)", err)
	}
}
