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

// A request admitted by on_store_error (fail_open, local) while this
// instance was cut off from Redis weighs its KV-cache tokens once Redis
// counts it (adopted), not only a permit: another instance's request
// that would take the tokens past kv_tokens beside it waits.
func TestPermitsAdmittedDuringAnOutageWeighTheirTokensOnceAdopted(t *testing.T) {
	t.Parallel() // its own redis-server: it waits on it, not on the CPU
	for _, tc := range []struct {
		name string
		cfg  fairqueue.Config
	}{
		{"fail_open", fairqueue.Config{FailOpen: true}},
		{"local", fairqueue.Config{Fallback: memstore.New(), LocalPermits: 5}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			srv := redistest.Start(t)
			const name = "adopttokens"
			cfg := tc.cfg
			cfg.Permits, cfg.KVTokens = 10, 300
			cfg.Lease, cfg.PollInterval, cfg.MaxWait = 1500*time.Millisecond, 50*time.Millisecond, 10*time.Second
			warm := fairqueue.Request{Tokens: 10}
			a, b, px := cutOffPair(t, srv, name, cfg, warm, warm)

			px.Cut()
			p, err := a.q.Acquire(context.Background(), fairqueue.Request{Tokens: 200})
			require.NoError(t, err)
			require.True(t, p.FailOpen() || p.Local(), "admitted by the policy")
			defer p.Release()
			px.Heal()
			eventually(t, 10*time.Second, func() bool {
				return len(readState(t, b.rdb, name).Holders) == 1
			}, "the permit admitted during the outage was never counted in Redis")

			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			defer cancel()
			q, err := b.q.Acquire(ctx, fairqueue.Request{Tokens: 200})
			if err == nil {
				q.Release()
			}
			assert.Error(t, err, "a 200-token request granted beside the running 200-token one under kv_tokens 300")
		})
	}
}
