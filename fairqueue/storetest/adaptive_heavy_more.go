package storetest

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
)

func init() {
	cases = append(cases,
		testCase{"LearnedPoolHeavyTicketAfterAReloadTookTheLargestOut", learnedPoolHeavyLargestRemoved},
		testCase{"LearnedPoolHeavyTicketWithAnUpstreamWithoutKVTokens", learnedPoolHeavyOneUncounted},
	)
}

// learnHalfOfA has q (a pool with a:1) learn a share of 0.5 for a:1.
func learnHalfOfA(t *testing.T, q *fairqueue.Queue) {
	t.Helper()
	p, err := q.Acquire(bg, fairqueue.Request{Tokens: 1}) // joins the queue
	require.NoError(t, err)
	p.Release()
	q.ObserveTTFT("a:1", time.Second)
	eventually(t, 10*time.Second, func() bool { return q.Shares()["a:1"] == 0.5 }, "a's share did not move")
}

// heavyWeighs acquires a ticket of tokens on q's idle queue and reports
// the upstream it runs on and what it weighs there.
func heavyWeighs(t *testing.T, q *fairqueue.Queue, tokens int) (string, int) {
	t.Helper()
	big, err := q.Acquire(bg, fairqueue.Request{Tokens: tokens})
	require.NoError(t, err, "a heavy ticket on an idle pool runs alone, never refused for its size")
	defer big.Release()
	snap, err := q.Inspect(bg, 0, 0)
	require.NoError(t, err)
	return big.Upstream(), snap.TokensHeld
}

// A reload takes a (1000 tokens, learned at 0.5: 500 in force, the
// largest) out of the pool and adds c (300); a's share is still kept.
// The largest capacity in force is now c's 300, b's 100 beside it: an
// 800-token ticket weighs 300 and runs on c.
func learnedPoolHeavyLargestRemoved(t *testing.T, h Harness) {
	const name = "learnedpoollargestout"
	cfg := fairqueue.Config{Upstreams: []fairqueue.Upstream{{Dial: "a:1", Permits: 4, KVTokens: 1000}, {Dial: "b:1", Permits: 4, KVTokens: 100}},
		MaxWait: 3 * time.Second, PollInterval: 50 * time.Millisecond,
		Adaptive: &fairqueue.Adaptive{TargetTTFT: 100 * time.Millisecond, Interval: 100 * time.Millisecond, Decrease: 0.5, MinSamples: 1}}
	q := h.NewNode(t, name, cfg)
	learnHalfOfA(t, q)
	cfg.Upstreams = []fairqueue.Upstream{{Dial: "b:1", Permits: 4, KVTokens: 100}, {Dial: "c:1", Permits: 4, KVTokens: 300}}
	require.NoError(t, q.Reconfigure(cfg))
	up, held := heavyWeighs(t, q, 800)
	assert.Equal(t, "c:1", up, "the largest capacity in force is c's")
	assert.Equal(t, 300, held, "the ticket weighs c's capacity in force, not the removed a's")
}

// A pool where b sets no kv_tokens (bounded by the queue's 1000 alone)
// beside a (1000, learned at 0.5): b's capacity is the queue's, all of
// it, so an 800-token ticket weighs 800.
func learnedPoolHeavyOneUncounted(t *testing.T, h Harness) {
	const name = "learnedpooluncounted"
	cfg := fairqueue.Config{Upstreams: []fairqueue.Upstream{{Dial: "a:1", Permits: 4, KVTokens: 1000}, {Dial: "b:1", Permits: 4}},
		KVTokens: 1000, MaxWait: 3 * time.Second, PollInterval: 50 * time.Millisecond,
		Adaptive: &fairqueue.Adaptive{TargetTTFT: 100 * time.Millisecond, Interval: 100 * time.Millisecond, Decrease: 0.5, MinSamples: 1}}
	q := h.NewNode(t, name, cfg)
	learnHalfOfA(t, q)
	up, held := heavyWeighs(t, q, 800)
	assert.Equal(t, "b:1", up, "800 fit b only (a's capacity in force is 500)")
	assert.Equal(t, 800, held, "b is bounded by the queue's capacity alone")
}
