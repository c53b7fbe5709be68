package storetest

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
)

func init() {
	cases = append(cases,
		testCase{"LearnedPoolOfUnequalUpstreamsRunsAHeavyTicketAlone", learnedPoolUnequalHeavy},
	)
}

// With a pool whose upstreams hold unequal caches, the largest capacity
// in force need not be the largest upstream's: here a (1000 tokens)
// learned a share of 0.5 (500 in force) while b (100 tokens) keeps all
// of its own. A ticket of 800 tokens is heavier than both: it weighs the
// largest capacity in force (a's 500) and runs alone on a, as it would
// without a learned capacity, instead of waiting out max_wait on a queue
// where it fits nowhere (weighed at the configured 1000, or at a's 1000
// times b's share of 1).
func learnedPoolUnequalHeavy(t *testing.T, h Harness) {
	const name = "learnedpoolunequal"
	cfg := fairqueue.Config{Upstreams: []fairqueue.Upstream{{Dial: "a:1", Permits: 4, KVTokens: 1000}, {Dial: "b:1", Permits: 4, KVTokens: 100}},
		MaxWait: 3 * time.Second, PollInterval: 50 * time.Millisecond,
		Adaptive: &fairqueue.Adaptive{TargetTTFT: 100 * time.Millisecond, Interval: 100 * time.Millisecond, Decrease: 0.5, MinSamples: 1}}
	q := h.NewNode(t, name, cfg)
	p, err := q.Acquire(bg, fairqueue.Request{Tokens: 1}) // joins the queue
	require.NoError(t, err)
	p.Release()
	q.ObserveTTFT("a:1", time.Second)
	eventually(t, 10*time.Second, func() bool { return q.Share() < 1 }, "the share did not move")
	require.Equal(t, map[string]float64{"a:1": 0.5}, q.Shares(), "b has no share of its own: all of it")

	big, err := q.Acquire(bg, fairqueue.Request{Tokens: 800})
	require.NoError(t, err, "an 800-token ticket on an idle pool whose largest capacity in force is a's 500 (b's is 100): it runs alone there, never refused for its size")
	assert.Equal(t, "a:1", big.Upstream(), "the largest capacity in force is a's")
	snap, err := q.Inspect(bg, 0, 0)
	require.NoError(t, err)
	assert.Equal(t, 500, snap.TokensHeld, "the ticket weighs a's capacity in force")
	ctx, cancel := context.WithTimeout(bg, 300*time.Millisecond)
	defer cancel()
	if p2, err := q.Acquire(ctx, fairqueue.Request{Tokens: 100}); err != nil {
		t.Errorf("a 100-token ticket beside the heavy one on a: b's 100 are free, got %v", err)
	} else {
		assert.Equal(t, "b:1", p2.Upstream(), "a is full")
		p2.Release()
	}
	big.Release()
}
