package storetest

import (
	"context"
	"sort"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
)

func init() {
	cases = append(cases,
		testCase{"HeavyTenantGetsNoMoreThanItsShare", heavyTenant},
		testCase{"LightTenantJumpsAheadOfHeavyBacklog", lightTenant},
		testCase{"WeightsSplitThePermits", weights},
		testCase{"QueueCapsRejectAtOnce", caps},
		testCase{"RetryAfterFollowsTheDrainRate", retryAfter},
		testCase{"HigherBandFirstLowerBandStillProgresses", priorities},
	)
}

type tenantGrant struct {
	tenant  string
	seq, no int64
}

// backlog runs closed-loop clients (clients[tenant] each) on the nodes
// until `grants` permits were granted in all, holding each for hold, and
// returns the grants in grant order.
func backlog(t *testing.T, nodes []*fairqueue.Queue, clients map[string]int, weights map[string]float64, grants int, hold time.Duration) []tenantGrant {
	ctx, stop := context.WithCancel(bg)
	defer stop()
	var mu sync.Mutex
	var out []tenantGrant
	var wg sync.WaitGroup
	i := 0
	for tenant, n := range clients {
		for range n {
			q := nodes[i%len(nodes)]
			i++
			wg.Add(1)
			go func() {
				defer wg.Done()
				for {
					p, err := q.Acquire(ctx, fairqueue.Request{Tenant: tenant, Weight: weights[tenant]})
					if err != nil {
						return
					}
					no := GrantNo(t, p) // while held: see GrantNo
					mu.Lock()
					out = append(out, tenantGrant{tenant, p.Seq(), no})
					done := len(out) >= grants
					mu.Unlock()
					time.Sleep(hold)
					p.Release()
					if done {
						stop()
						return
					}
				}
			}()
		}
	}
	wg.Wait()
	sort.Slice(out, func(i, j int) bool { return out[i].no < out[j].no })
	return out
}

func fairNodes(t *testing.T, h Harness, name string, cfg fairqueue.Config) []*fairqueue.Queue {
	cfg.Fair = true
	var nodes []*fairqueue.Queue
	for range 3 {
		nodes = append(nodes, h.NewNode(t, name, cfg))
	}
	return nodes
}

// jain is Jain's fairness index of xs: 1 when all are equal.
func jain(xs []float64) float64 {
	var sum, sq float64
	for _, x := range xs {
		sum += x
		sq += x * x
	}
	return sum * sum / (float64(len(xs)) * sq)
}

// One tenant with ten times the clients of four others, everyone
// backlogged, on three nodes: every tenant gets the same share of
// grants, and each tenant's own requests are served in arrival order.
func heavyTenant(t *testing.T, h Harness) {
	nodes := fairNodes(t, h, "heavy", fairqueue.Config{Permits: 2, MaxWait: time.Minute})
	clients := map[string]int{"heavy": 40, "a": 4, "b": 4, "c": 4, "d": 4}
	got := backlog(t, nodes, clients, nil, 500, time.Millisecond)
	// Skip the start-up, when not every tenant is queued yet.
	got = got[100:]
	counts := map[string]float64{}
	last := map[string]int64{}
	for _, g := range got {
		counts[g.tenant]++
		require.NotZero(t, g.no, "grant number known")
		assert.Greater(t, g.seq, last[g.tenant], "FIFO inside tenant %s", g.tenant)
		last[g.tenant] = g.seq
	}
	var xs []float64
	for tenant := range clients {
		xs = append(xs, counts[tenant])
	}
	j := jain(xs)
	t.Logf("grants per tenant %v, Jain's index %.3f", counts, j)
	assert.GreaterOrEqual(t, j, 0.98)
}

// A light tenant's request arriving behind a heavy tenant's long backlog
// has at most a few grants ahead of it.
func lightTenant(t *testing.T, h Harness) {
	nodes := fairNodes(t, h, "light", fairqueue.Config{Permits: 1, MaxWait: time.Minute})
	hold, err := nodes[0].Acquire(bg, fairqueue.Request{Tenant: "heavy"})
	require.NoError(t, err)
	ctx, stop := context.WithCancel(bg)
	defer stop()
	var wg sync.WaitGroup
	for i := range 50 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if p, err := nodes[i%3].Acquire(ctx, fairqueue.Request{Tenant: "heavy"}); err == nil {
				p.Release()
			}
		}()
	}
	eventually(t, 5*time.Second, func() bool { w, _ := h.State(t, "light"); return len(w) == 50 }, "heavy backlog not queued")
	light := make(chan *fairqueue.Permit, 1)
	go func() {
		p, err := nodes[1].Acquire(bg, fairqueue.Request{Tenant: "light"})
		assert.NoError(t, err)
		light <- p
	}()
	eventually(t, 5*time.Second, func() bool { w, _ := h.State(t, "light"); return len(w) == 51 }, "light request not queued")
	hold.Release()
	p := <-light
	t.Logf("light tenant queued at position %d of 51, granted as grant %d", p.Position(), p.GrantNo())
	assert.LessOrEqual(t, p.Position(), 2, "at most one heavy request ahead")
	p.Release()
	stop()
	wg.Wait()
}

func weights(t *testing.T, h Harness) {
	nodes := fairNodes(t, h, "weights", fairqueue.Config{Permits: 2, MaxWait: time.Minute})
	got := backlog(t, nodes, map[string]int{"gold": 6, "basic": 6}, map[string]float64{"gold": 2, "basic": 1}, 300, time.Millisecond)
	counts := map[string]int{}
	for _, g := range got[60:] {
		counts[g.tenant]++
	}
	ratio := float64(counts["gold"]) / float64(counts["basic"])
	t.Logf("gold %d, basic %d: ratio %.2f", counts["gold"], counts["basic"], ratio)
	assert.InDelta(t, 2.0, ratio, 0.3)
}

func caps(t *testing.T, h Harness) {
	q := h.NewNode(t, "caps", fairqueue.Config{Permits: 1, Fair: true, MaxQueue: 3, MaxQueuePerTenant: 2})
	p, err := q.Acquire(bg, fairqueue.Request{Tenant: "a"})
	require.NoError(t, err)
	ctx, stop := context.WithCancel(bg)
	var wg sync.WaitGroup
	queue := func(tenant string, want int) {
		wg.Add(1)
		go func() { defer wg.Done(); _, _ = q.Acquire(ctx, fairqueue.Request{Tenant: tenant}) }()
		eventually(t, 2*time.Second, func() bool { w, _ := h.State(t, "caps"); return len(w) == want }, "not queued")
	}
	queue("a", 1)
	queue("a", 2)
	start := time.Now()
	_, err = q.Acquire(bg, fairqueue.Request{Tenant: "a"})
	assert.ErrorIs(t, err, fairqueue.ErrQueueFull, "a third of tenant a")
	assert.Less(t, time.Since(start), time.Second, "refused at once")
	queue("b", 3)
	_, err = q.Acquire(bg, fairqueue.Request{Tenant: "c"})
	var re *fairqueue.RejectError
	require.ErrorAs(t, err, &re, "the fourth overall")
	assert.Equal(t, fairqueue.ReasonQueueFull, re.Reason)
	assert.Equal(t, 4, re.Position)
	assert.GreaterOrEqual(t, re.RetryAfter, time.Second)
	stop()
	wg.Wait()
	p.Release()
	waiting, holders := h.State(t, "caps")
	assert.Empty(t, waiting)
	assert.Empty(t, holders)
}

// In a steady drain (one permit, each request holding it 100 ms), a
// request that times out at position P is told to retry after about
// P x 100 ms: within the documented bound of one second.
func retryAfter(t *testing.T, h Harness) {
	const hold = 100 * time.Millisecond
	q := h.NewNode(t, "retry", fairqueue.Config{Permits: 1, MaxWait: time.Minute, PollInterval: 50 * time.Millisecond})
	ctx, stop := context.WithCancel(bg)
	var wg sync.WaitGroup
	var served atomic.Int64
	for range 20 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				if p, err := q.Acquire(ctx, fairqueue.Request{}); err == nil {
					time.Sleep(hold)
					p.Release()
					served.Add(1)
				}
			}
		}()
	}
	// The rate over the same span the queue learns it from (its grants
	// since the load began: its window is a minute): a loaded machine
	// serves unevenly, and a rate of the last second alone may differ
	// from the whole span's by twice.
	start := time.Now()
	time.Sleep(2 * time.Second)
	rate := float64(served.Load()) / time.Since(start).Seconds()
	_, err := q.Acquire(bg, fairqueue.Request{MaxWait: 50 * time.Millisecond})
	stop()
	wg.Wait()
	var re *fairqueue.RejectError
	require.ErrorAs(t, err, &re)
	require.Equal(t, fairqueue.ReasonTimeout, re.Reason)
	want := float64(re.Position) / rate
	t.Logf("position %d at %.1f grants/s: Retry-After %s, drain time %.2fs", re.Position, rate, re.RetryAfter, want)
	assert.InDelta(t, want, re.RetryAfter.Seconds(), 1.0, "Retry-After is ceil(position / rate), within 1s")
}

// Priority bands: a high-band request overtakes a low-band backlog at
// once; under sustained high-band load the low band still gets one grant
// in 1+PriorityFactor (the anti-starvation rule).
func priorities(t *testing.T, h Harness) {
	nodes := fairNodes(t, h, "bands", fairqueue.Config{Permits: 1, MaxWait: time.Minute, PriorityFactor: 4})
	ctx, stop := context.WithCancel(bg)
	defer stop()
	var mu sync.Mutex
	counts := map[int]int{}
	var wg sync.WaitGroup
	run := func(band, clients int) {
		for i := range clients {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for ctx.Err() == nil {
					p, err := nodes[i%3].Acquire(ctx, fairqueue.Request{Priority: band})
					if err != nil {
						return
					}
					mu.Lock()
					counts[band]++
					mu.Unlock()
					time.Sleep(time.Millisecond)
					p.Release()
				}
			}()
		}
	}
	run(0, 10)
	eventually(t, 5*time.Second, func() bool { w, _ := h.State(t, "bands"); return len(w) >= 8 }, "low band not backlogged")
	p, err := nodes[1].Acquire(bg, fairqueue.Request{Priority: 2})
	require.NoError(t, err)
	assert.LessOrEqual(t, p.Position(), 2, "a high-band request overtakes the low-band backlog")
	p.Release()

	run(2, 10)
	time.Sleep(300 * time.Millisecond)
	mu.Lock()
	counts = map[int]int{}
	mu.Unlock()
	time.Sleep(time.Second)
	mu.Lock()
	low, high := counts[0], counts[2]
	mu.Unlock()
	stop()
	wg.Wait()
	share := float64(low) / float64(low+high)
	t.Logf("sustained load in both bands: band 2 %d grants, band 0 %d (share %.3f, rule: 1/17)", high, low, share)
	assert.Greater(t, low, 0, "the low band is not starved")
	assert.InDelta(t, 1.0/17, share, 0.04)
}
