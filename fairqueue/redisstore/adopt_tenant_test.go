package redisstore_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
	"github.com/fair-queue/caddy-fair-queue/fairqueue/memstore"
	"github.com/fair-queue/caddy-fair-queue/internal/redistest"
)

// A tenant's request admitted by on_store_error (fail_open, local)
// while this instance was cut off from Redis counts against the tenant's
// max_in_flight_per_tenant once Redis counts it (adopted): the tenant's
// next request, on another instance, waits; another tenant's does not.
func TestPermitsAdmittedDuringAnOutageCountForTheirTenantOnceAdopted(t *testing.T) {
	t.Parallel() // its own redis-server: it waits on it, not on the CPU
	for _, tc := range []struct {
		name string
		cfg  fairqueue.Config
	}{
		{"fail_open", fairqueue.Config{FailOpen: true}},
		{"local", fairqueue.Config{Fallback: memstore.New(), LocalPermits: 2}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			srv := redistest.Start(t)
			const name = "adopttenant"
			cfg := tc.cfg
			cfg.Permits, cfg.Fair, cfg.MaxInFlightPerTenant = 4, true, 1
			cfg.Lease, cfg.PollInterval, cfg.MaxWait = 1500*time.Millisecond, 50*time.Millisecond, 10*time.Second
			warm := fairqueue.Request{Tenant: "warmup"}
			a, b, px := cutOffPair(t, srv, name, cfg, warm, warm)

			px.Cut()
			p, err := a.q.Acquire(context.Background(), fairqueue.Request{Tenant: "x"})
			require.NoError(t, err)
			require.True(t, p.FailOpen() || p.Local(), "admitted by the policy")
			defer p.Release()
			px.Heal()
			eventually(t, 10*time.Second, func() bool {
				return len(readState(t, b.rdb, name).Holders) == 1
			}, "the permit admitted during the outage was never counted in Redis")

			other, err := b.q.Acquire(context.Background(), fairqueue.Request{Tenant: "y"})
			require.NoError(t, err, "another tenant is served")
			other.Release()
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			defer cancel()
			q, err := b.q.Acquire(ctx, fairqueue.Request{Tenant: "x"})
			if err == nil {
				q.Release()
			}
			assert.Error(t, err, "tenant x granted a second permit beside its running one under max_in_flight_per_tenant 1")
		})
	}
}
