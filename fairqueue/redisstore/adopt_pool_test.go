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

// A request admitted by on_store_error (allow, local) on a pool upstream
// while this instance was cut off from Redis counts on that upstream
// once adopted, with its tokens: another instance's requests go to the
// other upstream, none beside it on its own, and once it ends both
// upstreams serve again, with no key left after the last leave.
func TestPermitsAdmittedDuringAnOutageCountOnTheirUpstreamOnceAdopted(t *testing.T) {
	t.Parallel() // its own redis-server: it waits on it, not on the CPU
	for _, tc := range []struct {
		name string
		cfg  fairqueue.Config
	}{
		{"allow", fairqueue.Config{FailOpen: true}},
		{"local", fairqueue.Config{Fallback: memstore.New(), LocalPermits: 1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			srv := redistest.Start(t)
			name := "adoptpool" + tc.name
			cfg := tc.cfg
			cfg.Permits, cfg.Fair, cfg.KVTokens = 2, true, 200
			cfg.Upstreams = []fairqueue.Upstream{{Dial: "u1:1", Permits: 1, KVTokens: 100}, {Dial: "u2:1", Permits: 1, KVTokens: 100}}
			cfg.Lease, cfg.PollInterval, cfg.MaxWait = 30*time.Second, 50*time.Millisecond, 5*time.Second
			warm := fairqueue.Request{Tenant: "warmup"}
			a, b, px := cutOffPair(t, srv, name, cfg, warm, warm)
			ctx := context.Background()

			px.Cut()
			p, err := a.q.Acquire(ctx, fairqueue.Request{Tenant: "x", Tokens: 80})
			require.NoError(t, err)
			require.True(t, p.FailOpen() || p.Local(), "admitted by the policy")
			require.NotEmpty(t, p.Upstream(), "runs on a pool upstream")
			px.Heal()
			eventually(t, 10*time.Second, func() bool {
				return len(readState(t, b.rdb, name).Holders) == 1
			}, "the permit admitted during the outage was never counted in Redis")

			q, err := b.q.Acquire(ctx, fairqueue.Request{Tenant: "y", Tokens: 80})
			require.NoError(t, err, "the other upstream is free")
			assert.NotEqual(t, p.Upstream(), q.Upstream(), "granted beside the adopted request on its upstream")
			wctx, cancel := context.WithTimeout(ctx, 2*time.Second)
			r, err := b.q.Acquire(wctx, fairqueue.Request{Tenant: "z", Tokens: 10})
			cancel()
			if err == nil {
				t.Errorf("a third request ran on %s beside the adopted one on %s and %s's on %s, one permit each",
					r.Upstream(), p.Upstream(), q.Ticket(), q.Upstream())
				r.Release()
			}
			q.Release()
			p.Release()
			eventually(t, 10*time.Second, func() bool {
				return len(readState(t, b.rdb, name).Holders) == 0
			}, "the adopted permit was never given back")

			// Both upstreams free, with all their tokens.
			takeAtOnce(t, b, "an upstream's permit or tokens left held after the outage",
				fairqueue.Request{Tenant: "x", Tokens: 100}, fairqueue.Request{Tenant: "y", Tokens: 100})
			require.NoError(t, a.q.Close())
			require.NoError(t, b.q.Close())
			assert.Empty(t, srv.Keys(t, "*"), "keys left after the last instance left")
		})
	}
}
