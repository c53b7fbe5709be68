package storetest

import (
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
)

// Capacity in tokens (Config.KVTokens, Upstream.KVTokens): the weights
// held never pass the capacity, across nodes and per upstream; FIFO is
// strict; the fair order passes a head that does not fit at most
// fairqueue.TokenPasses times in a row; a request heavier than the
// capacity runs alone; a lowered capacity delays grants, never revokes.
func init() {
	cases = append(cases,
		testCase{"TokensHeldNeverPassTheCapacityAcrossNodes", tokensBurst},
		testCase{"TokensFIFOHeavyHeadIsNotPassed", tokensFIFO},
		testCase{"TokensFairPassesAHeavyHeadAtMostTokenPassesTimes", tokensFairPasses},
		testCase{"TokensHeavierThanTheCapacityRunsAlone", tokensClamped},
		testCase{"TokensPerUpstreamNeverPassItsCapacity", tokensPool},
		testCase{"TokensLoweredCapacityDelaysGrantsUntilHeldFits", tokensLowered},
	)
}

// tokenMeter counts the weights inside the critical section: added after
// the grant, taken before the release, so its peak is at most the
// store's.
type tokenMeter struct {
	mu       sync.Mutex
	in, peak map[string]int // by upstream ("" : all)
}

func newTokenMeter() *tokenMeter {
	return &tokenMeter{in: map[string]int{}, peak: map[string]int{}}
}

func (m *tokenMeter) add(up string, w int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	keys := []string{""}
	if up != "" {
		keys = append(keys, up)
	}
	for _, k := range keys {
		m.in[k] += w
		m.peak[k] = max(m.peak[k], m.in[k])
	}
}

func (m *tokenMeter) sub(up string, w int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.in[""] -= w
	if up != "" {
		m.in[up] -= w
	}
}

// Two nodes, many requests of mixed weights: the weights inside never
// pass kv_tokens, and every request is served.
func tokensBurst(t *testing.T, h Harness) {
	cfg := fairqueue.Config{KVTokens: 100, MaxWait: time.Minute, PollInterval: 50 * time.Millisecond}
	nodes := []*fairqueue.Queue{h.NewNode(t, "tokburst", cfg), h.NewNode(t, "tokburst", cfg)}
	m := newTokenMeter()
	var wg sync.WaitGroup
	weights := []int{5, 40, 10, 70, 25, 1, 100, 30}
	for i := range 80 {
		q := nodes[i%2]
		w := weights[i%len(weights)]
		wg.Go(func() {
			p, err := q.Acquire(bg, fairqueue.Request{Tokens: w})
			if !assert.NoError(t, err) {
				return
			}
			assert.Equal(t, w, p.Tokens())
			m.add("", w)
			time.Sleep(time.Duration(1+i%3) * time.Millisecond)
			m.sub("", w)
			p.Release()
		})
	}
	wg.Wait()
	assert.LessOrEqual(t, m.peak[""], 100, "tokens inside never above kv_tokens")
	assert.Greater(t, m.peak[""], 40, "the capacity is used: several requests run together")
	waiting, holders := h.State(t, "tokburst")
	assert.Empty(t, waiting)
	assert.Empty(t, holders)
	snap, err := nodes[0].Inspect(bg, 0, 0)
	require.NoError(t, err)
	assert.Zero(t, snap.TokensHeld, "every weight returned")
}

// FIFO: a head that does not fit waits, and a lighter ticket behind it,
// which would fit, waits too; the head goes first when room frees.
func tokensFIFO(t *testing.T, h Harness) {
	q := h.NewNode(t, "tokfifo", fairqueue.Config{KVTokens: 100, MaxWait: time.Minute, PollInterval: 50 * time.Millisecond})
	a, err := q.Acquire(bg, fairqueue.Request{Tokens: 60})
	require.NoError(t, err)
	heavy := acquireAsync(t, h, "tokfifo", q, fairqueue.Request{Tokens: 80}, 1)
	light := acquireAsync(t, h, "tokfifo", q, fairqueue.Request{Tokens: 10}, 2)
	notGranted(t, light, "the light ticket behind a heavy head (it would fit: 60+10)")
	snap, err := q.Inspect(bg, 0, 0)
	require.NoError(t, err)
	assert.Equal(t, 60, snap.TokensHeld)
	a.Release()
	ph := await(t, heavy, "the heavy head")
	pl := await(t, light, "the light ticket: 80+10 fit")
	assert.Less(t, ph.Seq(), pl.Seq())
	snap, err = q.Inspect(bg, 0, 0)
	require.NoError(t, err)
	assert.Equal(t, 90, snap.TokensHeld)
	ph.Release()
	pl.Release()
}

// Fair order: the first flow's head (80) does not fit beside a holder
// of 50; light heads of another flow pass it, TokenPasses of them and no
// more although more would fit; when the holder ends, the heavy head is
// served before any further light one.
func tokensFairPasses(t *testing.T, h Harness) {
	const name = "tokfair"
	q := h.NewNode(t, name, fairqueue.Config{Fair: true, KVTokens: 100, MaxWait: time.Minute, PollInterval: 50 * time.Millisecond})
	hold, err := q.Acquire(bg, fairqueue.Request{Tenant: "holder", Tokens: 50})
	require.NoError(t, err)
	heavy := acquireAsync(t, h, name, q, fairqueue.Request{Tenant: "heavy", Tokens: 80}, 1)
	n := fairqueue.TokenPasses + 4
	var lights []<-chan *fairqueue.Permit
	for range n {
		ch := make(chan *fairqueue.Permit, 1)
		go func() {
			p, err := q.Acquire(bg, fairqueue.Request{Tenant: "light", Tokens: 1})
			assert.NoError(t, err)
			ch <- p
		}()
		lights = append(lights, ch)
	}
	granted := func() (ps []*fairqueue.Permit) {
		for _, ch := range lights {
			select {
			case p := <-ch:
				ps = append(ps, p)
			default:
			}
		}
		return ps
	}
	var passed []*fairqueue.Permit
	eventually(t, 10*time.Second, func() bool {
		passed = append(passed, granted()...)
		w, _ := h.State(t, name)
		return len(passed)+len(w) == n+1
	}, "the light tickets are not all granted or queued")
	time.Sleep(200 * time.Millisecond) // reconcile runs meanwhile: it passes no more
	passed = append(passed, granted()...)
	assert.Len(t, passed, fairqueue.TokenPasses, "light heads pass the heavy one TokenPasses times, no more (50+8+1 would fit)")
	notGranted(t, heavy, "the heavy head: 50+8+80 do not fit")
	hold.Release()
	ph := await(t, heavy, "the heavy head once the holder ended (8+80 fit)")
	assert.Equal(t, 80, ph.Tokens())
	for _, p := range passed {
		assert.Less(t, p.Seq(), ph.Seq()+int64(n+1))
		p.Release()
	}
	rest := 0
	eventually(t, 10*time.Second, func() bool {
		for _, p := range granted() {
			rest++
			p.Release()
		}
		return rest == n-fairqueue.TokenPasses
	}, "the other light tickets are served")
	ph.Release()
}

// A request heavier than the capacity is clamped to it: it runs alone.
func tokensClamped(t *testing.T, h Harness) {
	q := h.NewNode(t, "tokclamp", fairqueue.Config{KVTokens: 100, MaxWait: time.Minute, PollInterval: 50 * time.Millisecond})
	big, err := q.Acquire(bg, fairqueue.Request{Tokens: 500})
	require.NoError(t, err)
	assert.Equal(t, 100, big.Tokens(), "clamped to kv_tokens")
	w, clamped := q.Config().ClampTokens(500)
	assert.Equal(t, 100, w)
	assert.True(t, clamped)
	small := acquireAsync(t, h, "tokclamp", q, fairqueue.Request{Tokens: 1}, 1)
	notGranted(t, small, "nothing runs beside it")
	big.Release()
	await(t, small, "the small one after it").Release()
}

// A pool whose upstreams have their own capacities: each one's weights
// never pass it, and a request that fits only the larger goes there.
func tokensPool(t *testing.T, h Harness) {
	ups := []fairqueue.Upstream{{Dial: "a:1", Permits: 50, KVTokens: 100}, {Dial: "b:1", Permits: 50, KVTokens: 50}}
	cfg := fairqueue.Config{Upstreams: ups, MaxWait: time.Minute, PollInterval: 50 * time.Millisecond}
	nodes := []*fairqueue.Queue{h.NewNode(t, "tokpool", cfg), h.NewNode(t, "tokpool", cfg)}
	require.Equal(t, 150, nodes[0].Config().KVTokens, "the queue's capacity is the upstreams' sum")
	m := newTokenMeter()
	var wg sync.WaitGroup
	weights := []int{5, 40, 10, 70, 25, 1, 30}
	for i := range 70 {
		q := nodes[i%2]
		w := weights[i%len(weights)]
		wg.Go(func() {
			p, err := q.Acquire(bg, fairqueue.Request{Tokens: w})
			if !assert.NoError(t, err) {
				return
			}
			if w > 50 {
				assert.Equal(t, "a:1", p.Upstream(), "%d tokens fit a only", w)
			}
			m.add(p.Upstream(), w)
			time.Sleep(time.Duration(1+i%3) * time.Millisecond)
			m.sub(p.Upstream(), w)
			p.Release()
		})
	}
	wg.Wait()
	assert.LessOrEqual(t, m.peak["a:1"], 100)
	assert.LessOrEqual(t, m.peak["b:1"], 50)
	assert.Positive(t, m.peak["b:1"], "b is used too")
	snap, err := nodes[0].Inspect(bg, 0, 0)
	require.NoError(t, err)
	assert.Zero(t, snap.TokensHeld)
	for _, u := range snap.Upstreams {
		assert.Zero(t, u.TokensHeld, u.Dial)
	}
}

// A reload that lowers kv_tokens revokes nothing and grants nothing more
// until the weights held fit the new capacity.
func tokensLowered(t *testing.T, h Harness) {
	cfg := fairqueue.Config{KVTokens: 100, MaxWait: time.Minute, PollInterval: 50 * time.Millisecond}
	q := h.NewNode(t, "toklow", cfg)
	a, err := q.Acquire(bg, fairqueue.Request{Tokens: 40})
	require.NoError(t, err)
	b, err := q.Acquire(bg, fairqueue.Request{Tokens: 40})
	require.NoError(t, err)
	cfg.KVTokens = 50
	require.NoError(t, q.Reconfigure(cfg))
	c := acquireAsync(t, h, "toklow", q, fairqueue.Request{Tokens: 10}, 1)
	notGranted(t, c, "80 held, 50 allowed")
	a.Release()
	await(t, c, "40+10 fit 50").Release()
	b.Release()
}
