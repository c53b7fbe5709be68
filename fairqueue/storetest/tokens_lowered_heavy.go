package storetest

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
)

// A reload that lowers kv_tokens below the weight of a request waiting
// (350 to 150, a waiter of 301 that waited for a holder of 101): the
// waiter is heavier than the new capacity, so it is clamped to it and
// runs alone once the holder ends, not left waiting out its max wait for
// room that never comes.
func init() {
	cases = append(cases,
		testCase{"TokensWaiterHeavierThanALoweredCapacityRunsAlone", tokensLoweredHeavy},
		testCase{"TokensWaiterHeavierThanEveryLoweredUpstreamRunsAlone", tokensLoweredHeavyPool},
	)
}

func tokensLoweredHeavy(t *testing.T, h Harness) {
	cfg := fairqueue.Config{KVTokens: 350, MaxWait: time.Minute, PollInterval: 50 * time.Millisecond}
	q := h.NewNode(t, "toklowheavy", cfg)
	a, err := q.Acquire(bg, fairqueue.Request{Tokens: 101})
	require.NoError(t, err)
	heavy := acquireAsync(t, h, "toklowheavy", q, fairqueue.Request{Tokens: 301}, 1)
	cfg.KVTokens = 150
	require.NoError(t, q.Reconfigure(cfg))
	notGranted(t, heavy, "101 held")
	a.Release()
	await(t, heavy, "alone, clamped to the new 150").Release()
}

// Likewise with a pool whose upstreams set their own kv_tokens: a waiter
// of 90 that fits a (100) only, waiting for a holder of 30 there, after a
// reload lowers a to 60 (b has 50) fits no upstream: it is clamped to
// the largest, and runs alone on a once the holder ends.
func tokensLoweredHeavyPool(t *testing.T, h Harness) {
	ab := []fairqueue.Upstream{{Dial: "a:1", Permits: 4, KVTokens: 100}, {Dial: "b:1", Permits: 4, KVTokens: 50}}
	cfg := fairqueue.Config{Upstreams: ab, MaxWait: time.Minute, PollInterval: 50 * time.Millisecond}
	q := h.NewNode(t, "toklowheavypool", cfg)
	x, err := q.Acquire(bg, fairqueue.Request{Tokens: 60})
	require.NoError(t, err)
	require.Equal(t, "a:1", x.Upstream(), "60 tokens fit a only")
	heavy := acquireAsync(t, h, "toklowheavypool", q, fairqueue.Request{Tokens: 90}, 1)
	cfg.Upstreams = []fairqueue.Upstream{{Dial: "a:1", Permits: 4, KVTokens: 60}, ab[1]}
	cfg.KVTokens = 0 // the new sum
	require.NoError(t, q.Reconfigure(cfg))
	notGranted(t, heavy, "60 held on a")
	x.Release()
	p := await(t, heavy, "alone on a, clamped to its new 60")
	require.Equal(t, "a:1", p.Upstream())
	p.Release()
}
