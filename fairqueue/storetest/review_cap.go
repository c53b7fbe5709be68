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
		testCase{"LearnedPoolBoundsAHeavyTicketByTheLargestUpstream", learnedPoolHeavy},
		testCase{"LearnedQueueShareDoesNotCapAPoolAddedByAReload", learnedQueueThenPool},
		testCase{"ReleaseSentAgainDoesNotExtendTheCooldown", coolSentAgain},
	)
}

// With a pool, an upstream that has no learned share of its own runs at
// its whole capacity: a ticket as heavy as that capacity still weighs all
// of it (the bound follows the largest learned capacity, here b's 100,
// not a's share alone), so it runs alone on b, and never on a, whose
// learned capacity (50) is below its weight.
func learnedPoolHeavy(t *testing.T, h Harness) {
	const name = "learnedpoolheavy"
	cfg := fairqueue.Config{Upstreams: []fairqueue.Upstream{{Dial: "a:1", Permits: 4, KVTokens: 100}, {Dial: "b:1", Permits: 4, KVTokens: 100}},
		MaxWait: time.Minute, PollInterval: 50 * time.Millisecond,
		Adaptive: &fairqueue.Adaptive{TargetTTFT: 100 * time.Millisecond, Interval: 100 * time.Millisecond, Decrease: 0.5, MinSamples: 1}}
	q := h.NewNode(t, name, cfg)
	p, err := q.Acquire(bg, fairqueue.Request{Tokens: 1}) // joins the queue
	require.NoError(t, err)
	p.Release()
	q.ObserveTTFT("a:1", time.Second)
	eventually(t, 10*time.Second, func() bool { return q.Share() < 1 }, "the share did not move")
	require.Equal(t, map[string]float64{"a:1": 0.5}, q.Shares(), "b has no share of its own: all of it")

	big, err := q.Acquire(bg, fairqueue.Request{Tokens: 100})
	require.NoError(t, err)
	assert.Equal(t, "b:1", big.Upstream(), "100 tokens fit b's 100 only (a's learned capacity is 50)")
	snap, err := q.Inspect(bg, 0, 0)
	require.NoError(t, err)
	assert.Equal(t, 100, snap.TokensHeld, "the ticket weighs its 100 tokens")
	ctx, cancel := context.WithTimeout(bg, 300*time.Millisecond)
	defer cancel()
	if p2, err := q.Acquire(ctx, fairqueue.Request{Tokens: 100}); err == nil {
		t.Errorf("a second 100-token ticket granted on %q beside the first on %q: 200 tokens run at once (a's learned capacity is 50, b's 100)", p2.Upstream(), big.Upstream())
		p2.Release()
	}
	big.Release()
}

// The queue's share, learned without a pool, is the capacity of the
// queue as one backend. A reload that gives the queue a pool makes each
// upstream learn its own share ("with a pool, each upstream has a share
// of its own"): nobody reports the queue's share any more, so it can
// never move again, and it must not keep capping the pool's permits.
func learnedQueueThenPool(t *testing.T, h Harness) {
	const name = "learnedqueuethenpool"
	cfg := fairqueue.Config{Permits: 4, MaxWait: time.Minute, PollInterval: 50 * time.Millisecond,
		Adaptive: &fairqueue.Adaptive{TargetTTFT: 100 * time.Millisecond, Interval: 100 * time.Millisecond, Decrease: 0.5, MinSamples: 1}}
	q := h.NewNode(t, name, cfg)
	p, err := q.Acquire(bg, fairqueue.Request{}) // joins the queue
	require.NoError(t, err)
	p.Release()
	q.ObserveTTFT("", time.Second)
	eventually(t, 10*time.Second, func() bool { return q.Share() < 1 }, "the share did not move")
	require.Equal(t, map[string]float64{"": 0.5}, q.Shares())

	cfg.Permits = 0 // the pool's sum
	cfg.Upstreams = []fairqueue.Upstream{{Dial: "a:1", Permits: 2}, {Dial: "b:1", Permits: 2}}
	require.NoError(t, q.Reconfigure(cfg))
	var held []*fairqueue.Permit
	for range 4 {
		ctx, cancel := context.WithTimeout(bg, 300*time.Millisecond)
		p, err := q.Acquire(ctx, fairqueue.Request{})
		cancel()
		if err != nil {
			break
		}
		held = append(held, p)
	}
	assert.Len(t, held, 4, "a and b have no share of their own: each runs all of its 2 permits; the queue's old share (0.5) capped the pool at %d", len(held))
	for _, p := range held {
		p.Release()
	}
}

// A release sent again (the client's retry after a read timeout, its
// first run done) finds no holder: it must not cool the upstream again
// ("Only a ticket that still held a permit cools it: a release sent
// again does not extend the cooldown", memstore/pool.go).
func coolSentAgain(t *testing.T, h Harness) {
	s := store(t, h, "coolagain", "n1")
	l := fairqueue.Limits{Permits: 2, Lease: time.Minute, Upstreams: []fairqueue.Upstream{{Dial: "a:1", Permits: 2}}}
	res, err := s.Acquire(bg, ticket("n1:1", "n1", l))
	require.NoError(t, err)
	require.True(t, res.Granted)
	rel := ticket("n1:1", "n1", l)
	rel.Cool, rel.CoolFor = "a:1", 400*time.Millisecond
	require.NoError(t, s.Release(bg, rel))
	time.Sleep(300 * time.Millisecond)
	require.NoError(t, s.Release(bg, rel)) // sent again: n1:1 holds nothing
	time.Sleep(250 * time.Millisecond)     // 550 ms after the first: its cooldown ended
	res, err = s.Acquire(bg, ticket("n1:2", "n1", l))
	require.NoError(t, err)
	assert.True(t, res.Granted, "a cools 400 ms from the release that freed the permit; the one sent again extended it")
	require.NoError(t, s.Cancel(bg, ticket("n1:2", "n1", l)))
	require.NoError(t, s.Leave(bg, "n1", l))
}
