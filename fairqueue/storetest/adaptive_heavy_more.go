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

// learnHalf has q (a pool with dials) learn a share of 0.5 for each of
// dials.
func learnHalf(t *testing.T, q *fairqueue.Queue, dials ...string) {
	t.Helper()
	p, err := q.Acquire(bg, fairqueue.Request{Tokens: 1}) // joins the queue
	require.NoError(t, err)
	p.Release()
	for _, d := range dials {
		// A node reports once an interval, at an observation: observe
		// until the report went out and moved the share (one window).
		eventually(t, 10*time.Second, func() bool {
			if q.Shares()[d] == 0.5 {
				return true
			}
			q.ObserveTTFT(d, time.Second)
			return false
		}, "%s's share did not move: %v", d, q.Shares())
	}
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
// largest) out of the pool, leaving b (100) and c (600, learned at 0.5:
// 300 in force); a's share is still kept. The configured bound is c's
// 600 and b's share, all of its own, the largest; but the largest
// capacity in force is now c's 300: an 800-token ticket weighs 300 and
// runs on c (not a's 500, nor 600, where it would fit nowhere).
func learnedPoolHeavyLargestRemoved(t *testing.T, h Harness) {
	const name = "learnedpoollargestout"
	b, c := fairqueue.Upstream{Dial: "b:1", Permits: 4, KVTokens: 100}, fairqueue.Upstream{Dial: "c:1", Permits: 4, KVTokens: 600}
	cfg := fairqueue.Config{Upstreams: []fairqueue.Upstream{{Dial: "a:1", Permits: 4, KVTokens: 1000}, b, c},
		MaxWait: 3 * time.Second, PollInterval: 50 * time.Millisecond,
		Adaptive: &fairqueue.Adaptive{TargetTTFT: 100 * time.Millisecond, Interval: 100 * time.Millisecond, Decrease: 0.5, MinSamples: 1}}
	q := h.NewNode(t, name, cfg)
	learnHalf(t, q, "a:1", "c:1")
	cfg.Upstreams = []fairqueue.Upstream{b, c}
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
	learnHalf(t, q, "a:1")
	up, held := heavyWeighs(t, q, 800)
	assert.Equal(t, "b:1", up, "800 fit b only (a's capacity in force is 500)")
	assert.Equal(t, 800, held, "b is bounded by the queue's capacity alone")
}
