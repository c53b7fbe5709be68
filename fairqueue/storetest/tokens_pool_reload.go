package storetest

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
)

// A pool upstream's tokens held across reloads that take it out of the
// pool and bring it back, or lower its kv_tokens: the request running on
// it still holds them, so nothing is granted there beyond its capacity
// until it ends.
func init() {
	cases = append(cases,
		testCase{"TokensOfAnUpstreamRemovedAndBroughtBackStillCount", tokensUpstreamBack},
		testCase{"TokensOfAnUpstreamWhoseCapacityIsLoweredStillCount", tokensUpstreamLowered},
	)
}

func tokensUpstreamBack(t *testing.T, h Harness) {
	ab := []fairqueue.Upstream{{Dial: "a:1", Permits: 4, KVTokens: 100}, {Dial: "b:1", Permits: 4, KVTokens: 50}}
	cfg := fairqueue.Config{Upstreams: ab, KVTokens: 1000, MaxWait: time.Minute, PollInterval: 50 * time.Millisecond}
	q := h.NewNode(t, "tokback", cfg)
	x, err := q.Acquire(bg, fairqueue.Request{Tokens: 80})
	require.NoError(t, err)
	require.Equal(t, "a:1", x.Upstream(), "80 tokens fit a only")

	cfg.Upstreams = ab[1:] // a leaves the pool while x runs on it
	require.NoError(t, q.Reconfigure(cfg))
	cfg.Upstreams = ab // and comes back
	require.NoError(t, q.Reconfigure(cfg))
	y := acquireAsync(t, h, "tokback", q, fairqueue.Request{Tokens: 80}, 1)
	notGranted(t, y, "80 held on a, 80 more under its 100")
	x.Release()
	p := await(t, y, "x ended: 80 fit a")
	assert.Equal(t, "a:1", p.Upstream())
	p.Release()
	snap, err := q.Inspect(bg, 0, 0)
	require.NoError(t, err)
	assert.Zero(t, snap.TokensHeld)
	for _, u := range snap.Upstreams {
		assert.Zero(t, u.TokensHeld, u.Dial)
	}
}

func tokensUpstreamLowered(t *testing.T, h Harness) {
	ab := []fairqueue.Upstream{{Dial: "a:1", Permits: 4, KVTokens: 100}, {Dial: "b:1", Permits: 4, KVTokens: 50}}
	cfg := fairqueue.Config{Upstreams: ab, KVTokens: 1000, MaxWait: time.Minute, PollInterval: 50 * time.Millisecond}
	q := h.NewNode(t, "toklowup", cfg)
	x, err := q.Acquire(bg, fairqueue.Request{Tokens: 80})
	require.NoError(t, err)
	require.Equal(t, "a:1", x.Upstream(), "80 tokens fit a only")

	cfg.Upstreams = []fairqueue.Upstream{{Dial: "a:1", Permits: 4, KVTokens: 90}, ab[1]}
	require.NoError(t, q.Reconfigure(cfg))
	for range 3 { // 20 fit b, not beside x on a
		p, err := q.Acquire(bg, fairqueue.Request{Tokens: 15})
		require.NoError(t, err)
		assert.Equal(t, "b:1", p.Upstream(), "15 more beside 80 on a, above its 90")
		defer p.Release()
	}
	x.Release()
}
