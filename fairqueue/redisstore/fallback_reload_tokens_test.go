package redisstore_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
	"github.com/fair-queue/caddy-fair-queue/fairqueue/memstore"
	"github.com/fair-queue/caddy-fair-queue/internal/redistest"
)

// Local fallback, a reload while a request waits in the fallback queue
// that raises kv_tokens (or turns them on): once Redis counts the
// request (adopted), it weighs its tokens as the settings in force when
// it was served clamp them, not as those it came under did. Weighed as
// before the reload, Redis granted another instance's request beside it
// past kv_tokens: 250 + 200 on kv_tokens 400.
func TestLocalFallbackPermitWeighsTheTokensOfTheReloadOnceAdopted(t *testing.T) {
	t.Parallel() // its own redis-server: it waits on it, not on the CPU
	for _, tc := range []struct {
		name   string
		before int // kv_tokens before the reload
	}{
		{"raised", 100},
		{"turned_on", 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			srv := redistest.Start(t)
			const name = "fbreloadtokens"
			cfg := fairqueue.Config{Permits: 2, KVTokens: tc.before, LocalPermits: 1, Fallback: memstore.New(),
				Lease: 1500 * time.Millisecond, PollInterval: 50 * time.Millisecond, MaxWait: 20 * time.Second}
			a, b, px := cutOffPair(t, srv, name, cfg, fairqueue.Request{}, fairqueue.Request{})

			px.Cut()
			held, err := a.q.Acquire(context.Background(), fairqueue.Request{})
			require.NoError(t, err)
			require.True(t, held.Local(), "the request during the outage was not served by the fallback queue")
			queued := make(chan struct{})
			var once sync.Once
			got := make(chan *fairqueue.Permit, 1)
			go func() {
				p, err := a.q.Acquire(context.Background(), fairqueue.Request{Tokens: 250,
					OnQueued: func(fairqueue.Waiting) { once.Do(func() { close(queued) }) }}) // again as it is reweighed
				assert.NoError(t, err)
				got <- p
			}()
			select {
			case <-queued: // behind held, in the fallback queue
			case <-time.After(10 * time.Second):
				t.Fatal("the request never queued in the fallback queue")
			}

			cfg.KVTokens = 400
			require.NoError(t, a.q.Reconfigure(cfg))
			require.NoError(t, b.q.Reconfigure(cfg))
			held.Release()
			var p *fairqueue.Permit
			select {
			case p = <-got:
			case <-time.After(10 * time.Second):
				t.Fatal("the fallback queue never served the request")
			}
			require.NotNil(t, p)
			defer p.Release()
			require.True(t, p.Local())

			// The calls a sent before the reload (its probes while Redis
			// was away, a cancel) end within the store's timeout, before
			// Redis is back: one its client retries once Redis answers
			// dispatches under the settings it was sent with (kv_tokens
			// off), which is no weight of this request's (it flaked 5 in
			// 20 under load with the cut shorter than that).
			time.Sleep(a.q.Config().StoreTimeout)
			px.Heal()
			eventually(t, 10*time.Second, func() bool {
				return len(readState(t, b.rdb, name).Holders) == 1
			}, "the fallback queue's permit was never counted in Redis")
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			defer cancel()
			s, err := b.q.Acquire(ctx, fairqueue.Request{Tokens: 200})
			if err == nil {
				s.Release()
			}
			assert.Error(t, err, "a 200-token request granted beside the running 250-token one under kv_tokens 400")
		})
	}
}
