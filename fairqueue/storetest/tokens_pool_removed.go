package storetest

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
)

// A reload that takes an upstream out of a pool whose upstreams set
// their own kv_tokens (the queue's capacity their sum) while a request
// runs there: that request holds a's cache, not b's, so b, idle, serves
// a request that fits it at once instead of holding it until a's ends
// (past its max wait, for a long answer).
func init() {
	cases = append(cases,
		testCase{"TokensOfAnUpstreamRemovedDoNotKeepTheRestOfThePoolIdle", tokensUpstreamRemoved},
		testCase{"PermitsOfAnUpstreamRemovedDoNotKeepTheRestOfThePoolIdle", permitsUpstreamRemoved},
	)
}

func tokensUpstreamRemoved(t *testing.T, h Harness) {
	ab := []fairqueue.Upstream{{Dial: "a:1", Permits: 4, KVTokens: 100}, {Dial: "b:1", Permits: 4, KVTokens: 50}}
	cfg := fairqueue.Config{Upstreams: ab, MaxWait: time.Minute, PollInterval: 50 * time.Millisecond}
	q := h.NewNode(t, "tokremoved", cfg)
	x, err := q.Acquire(bg, fairqueue.Request{Tokens: 80})
	require.NoError(t, err)
	require.Equal(t, "a:1", x.Upstream(), "80 tokens fit a only")

	cfg.Upstreams = ab[1:] // a leaves the pool while x runs on it
	require.NoError(t, q.Reconfigure(cfg))
	y := acquireAsync(t, h, "tokremoved", q, fairqueue.Request{Tokens: 40}, 0)
	p := await(t, y, "40 fit b, idle")
	assert.Equal(t, "b:1", p.Upstream())
	p.Release()
	x.Release()
}

func permitsUpstreamRemoved(t *testing.T, h Harness) {
	ab := []fairqueue.Upstream{{Dial: "a:1", Permits: 1}, {Dial: "b:1", Permits: 1}}
	cfg := fairqueue.Config{Upstreams: ab, MaxWait: time.Minute, PollInterval: 50 * time.Millisecond}
	q := h.NewNode(t, "permremoved", cfg)
	x, err := q.Acquire(bg, fairqueue.Request{})
	require.NoError(t, err)
	keep := []fairqueue.Upstream{{Dial: "b:1", Permits: 1}}
	if x.Upstream() == "b:1" {
		keep = []fairqueue.Upstream{{Dial: "a:1", Permits: 1}}
	}
	cfg.Upstreams = keep
	require.NoError(t, q.Reconfigure(cfg))
	y := acquireAsync(t, h, "permremoved", q, fairqueue.Request{}, 0)
	p := await(t, y, "the pool's one upstream idle")
	assert.Equal(t, keep[0].Dial, p.Upstream())
	p.Release()
	x.Release()
}
