package storetest

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
)

// The learned capacity (Config.Adaptive): one share in the store for
// every node of the queue.
func init() {
	cases = append(cases,
		testCase{"LearnedPoolBoundsAHeavyTicketByTheLargestUpstream", learnedPoolHeavy},
		testCase{"LearnedQueueShareDoesNotCapAPoolAddedByAReload", learnedQueueThenPool},
		testCase{"LearnedCapacityIsOneValueForEveryNode", learnedShared},
		testCase{"LearnedCapacityOfAPoolIsOneSharePerUpstream", learnedPool},
	)
}

// One node's breaches halve the share; then a burst from three nodes
// runs at most the learned permits in all, not three times them, and
// the share grows back, by steps, from reports under the target while
// requests wait.
func learnedShared(t *testing.T, h Harness) {
	const name = "learned"
	cfg := fairqueue.Config{Permits: 10, MaxWait: time.Minute, PollInterval: 50 * time.Millisecond,
		Adaptive: &fairqueue.Adaptive{TargetTTFT: 100 * time.Millisecond, Interval: 100 * time.Millisecond, Decrease: 0.5, Step: 0.1, MinSamples: 1}}
	nodes := []*fairqueue.Queue{h.NewNode(t, name, cfg), h.NewNode(t, name, cfg), h.NewNode(t, name, cfg)}
	p, err := nodes[0].Acquire(bg, fairqueue.Request{}) // joins the queue
	require.NoError(t, err)
	p.Release()
	nodes[0].ObserveTTFT("", time.Second) // above the target: the first report goes at once
	eventually(t, 10*time.Second, func() bool { return nodes[0].Share() < 1 }, "the share did not move")
	require.Equal(t, 0.5, nodes[0].Share(), "one breach: halved")
	snap, err := nodes[2].Inspect(bg, 0, 0)
	require.NoError(t, err)
	assert.Equal(t, 0.5, snap.LearnedShare, "the store's share, seen from any node")

	var mu sync.Mutex
	inside, most := 0, 0
	var wg sync.WaitGroup
	for i := range 45 {
		q := nodes[i%3]
		wg.Go(func() {
			p, err := q.Acquire(bg, fairqueue.Request{})
			if !assert.NoError(t, err) {
				return
			}
			mu.Lock()
			inside++
			most = max(most, inside)
			mu.Unlock()
			time.Sleep(time.Duration(2+i%3) * time.Millisecond)
			mu.Lock()
			inside--
			mu.Unlock()
			p.Release()
		})
	}
	wg.Wait()
	assert.Equal(t, 5, most, "three nodes run the learned 5 permits together (10 x 0.5), not 5 each")

	// Under the target, while requests wait: the share grows back.
	hold := make([]*fairqueue.Permit, 0, 5)
	for range 5 {
		p, err := nodes[1].Acquire(bg, fairqueue.Request{})
		require.NoError(t, err)
		hold = append(hold, p)
	}
	waiter := acquireAsync(t, h, name, nodes[1], fairqueue.Request{}, 1) // the capacity is the limit
	eventually(t, 10*time.Second, func() bool {
		nodes[1].ObserveTTFT("", time.Millisecond) // reports at most once per interval
		time.Sleep(150 * time.Millisecond)
		return nodes[1].Share() > 0.5
	}, "the share did not grow: %v", nodes[1].Share())
	assert.GreaterOrEqual(t, nodes[1].Share(), 0.6, "by steps of 0.1")
	p = await(t, waiter, "the waiter, once a sixth permit is in force")
	p.Release()
	for _, p := range hold {
		p.Release()
	}
}

// With a pool, each upstream learns from its own answers: breaches on a
// halve a's permits alone, for every node.
func learnedPool(t *testing.T, h Harness) {
	const name = "learnedpool"
	cfg := fairqueue.Config{Upstreams: []fairqueue.Upstream{{Dial: "a:1", Permits: 4}, {Dial: "b:1", Permits: 4}},
		MaxWait: time.Minute, PollInterval: 50 * time.Millisecond,
		Adaptive: &fairqueue.Adaptive{TargetTTFT: 100 * time.Millisecond, Interval: 100 * time.Millisecond, Decrease: 0.5, MinSamples: 1}}
	nodes := []*fairqueue.Queue{h.NewNode(t, name, cfg), h.NewNode(t, name, cfg)}
	p, err := nodes[0].Acquire(bg, fairqueue.Request{}) // joins the queue
	require.NoError(t, err)
	p.Release()
	nodes[0].ObserveTTFT("a:1", time.Second) // the first report goes at once
	eventually(t, 10*time.Second, func() bool { return nodes[0].Share() < 1 }, "the share did not move")
	require.Equal(t, map[string]float64{"a:1": 0.5}, nodes[0].Shares(), "b has no share of its own yet: all of it")
	snap, err := nodes[1].Inspect(bg, 0, 0)
	require.NoError(t, err)
	for _, u := range snap.Upstreams {
		assert.Equal(t, map[string]float64{"a:1": 0.5}[u.Dial], u.LearnedShare, u.Dial)
	}

	var mu sync.Mutex
	inside, most := map[string]int{}, map[string]int{}
	var wg sync.WaitGroup
	for i := range 40 {
		q := nodes[i%2]
		wg.Go(func() {
			p, err := q.Acquire(bg, fairqueue.Request{})
			if !assert.NoError(t, err) {
				return
			}
			up := p.Upstream()
			mu.Lock()
			inside[up]++
			most[up] = max(most[up], inside[up])
			mu.Unlock()
			time.Sleep(time.Duration(2+i%3) * time.Millisecond)
			mu.Lock()
			inside[up]--
			mu.Unlock()
			p.Release()
		})
	}
	wg.Wait()
	assert.Equal(t, map[string]int{"a:1": 2, "b:1": 4}, most, "a at half its permits, b at all of them, both nodes together")
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
