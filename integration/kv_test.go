package integration

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
	"github.com/fair-queue/caddy-fair-queue/internal/harness"
	"github.com/fair-queue/caddy-fair-queue/internal/mockllm"
	"github.com/fair-queue/caddy-fair-queue/internal/redistest"
)

// Capacity in tokens (kv_tokens), through real Caddy processes. The
// upstream is the mock LLM behind kvGauge, which weighs each request it
// runs by the rule, from its own reading of the body: its message text's
// bytes / 4, rounded up, plus its max_tokens. The queue's weights are at
// least these: it starts at 4 bytes per token and learns from the mock's
// usage, whose prompt_tokens counts the whole body's bytes / 4.

// kvGauge is an upstream's view of the requests it runs: the sum of
// their weights and its peak, and the order they arrived in.
type kvGauge struct {
	mu      sync.Mutex
	held    int
	peak    int
	running int
	order   []kvArrival
}

// kvArrival is a request as it reached the upstream.
type kvArrival struct {
	seq    string // its X-Client-Seq
	weight int
	others int // the weight the upstream held when it came
}

// wrap counts the requests that next runs.
func (g *kvGauge) wrap(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		r.Body = io.NopCloser(bytes.NewReader(body))
		var req struct {
			MaxTokens int `json:"max_tokens"`
			Messages  []struct {
				Content string `json:"content"`
			} `json:"messages"`
		}
		_ = json.Unmarshal(body, &req)
		text := 0
		for _, m := range req.Messages {
			text += len(m.Content)
		}
		weight := (text+3)/4 + req.MaxTokens
		g.mu.Lock()
		g.order = append(g.order, kvArrival{seq: r.Header.Get(mockllm.HeaderClientSeq), weight: weight, others: g.held})
		g.held += weight
		g.running++
		g.peak = max(g.peak, g.held)
		g.mu.Unlock()
		defer func() {
			g.mu.Lock()
			g.held -= weight
			g.running--
			g.mu.Unlock()
		}()
		next.ServeHTTP(w, r)
	})
}

func (g *kvGauge) arrivals() []kvArrival {
	g.mu.Lock()
	defer g.mu.Unlock()
	return append([]kvArrival(nil), g.order...)
}

func (g *kvGauge) peakHeld() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.peak
}

// startGauged starts a mock LLM behind a kvGauge; it returns the gauge,
// the mock and the address to dial.
func startGauged(t *testing.T, cfg mockllm.Config) (*kvGauge, *mockllm.Server, string) {
	t.Helper()
	g, mock := new(kvGauge), mockllm.New(cfg)
	srv := httptest.NewServer(g.wrap(mock.Handler()))
	t.Cleanup(srv.Close)
	return g, mock, strings.TrimPrefix(srv.URL, "http://")
}

// kvChat is a chat request of a given weight: text bytes of message and
// max_tokens.
type kvChat struct {
	seq       string
	text      int
	maxTokens int
	tokens    int           // the mock's answer length (X-Mock-Tokens); 0: its default
	delay     time.Duration // per answer token (X-Mock-Delay); 0: the mock's default
	tenant    string
}

// weight is the request's weight by the rule, at 4 bytes per token.
func (k kvChat) weight() int { return (k.text+3)/4 + k.maxTokens }

func (k kvChat) send(ctx context.Context, client *http.Client, base string) Result {
	ctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	msgs, _ := json.Marshal([]map[string]string{{"role": "user", "content": strings.Repeat("x", k.text)}})
	body := fmt.Sprintf(`{"model":"mock","max_tokens":%d,"messages":%s}`, k.maxTokens, msgs)
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/chat/completions", strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(mockllm.HeaderClientSeq, k.seq)
	if k.tokens > 0 {
		req.Header.Set(mockllm.HeaderTokens, strconv.Itoa(k.tokens))
	}
	if k.delay > 0 {
		req.Header.Set(mockllm.HeaderDelay, k.delay.String())
	}
	if k.tenant != "" {
		req.Header.Set("X-Tenant", k.tenant)
	}
	resp, err := client.Do(req)
	if err != nil {
		return Result{Err: err, Done: time.Now()}
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return Result{Status: resp.StatusCode, Header: resp.Header, Body: string(b), Err: err, Done: time.Now()}
}

func (k kvChat) sendAsync(ctx context.Context, client *http.Client, base string) <-chan Result {
	out := make(chan Result, 1)
	go func() { out <- k.send(ctx, client, base) }()
	return out
}

// mixedChats are n requests of mixed prompts and max_tokens, each far
// lighter than capacity.
func mixedChats(n int, seed uint64) []kvChat {
	rng := rand.New(rand.NewPCG(seed, 1))
	out := make([]kvChat, n)
	for i := range out {
		out[i] = kvChat{seq: strconv.Itoa(i), text: 200 + rng.IntN(600), maxTokens: []int{20, 80, 150, 250}[rng.IntN(4)]}
	}
	return out
}

// Two instances on one Redis, one upstream of 1000 tokens, 40 clients
// at once with mixed weights: the upstream never holds more than 1000
// tokens of requests, runs several at once, and serves every one.
func TestKVTokensBoundWhatTheUpstreamHolds(t *testing.T) {
	rds := redistest.Start(t)
	const capacity = 1000
	g, _, upstream := startGauged(t, mockllm.Config{Tokens: 4, Delay: 25 * time.Millisecond})
	site := proxySite(upstream, fmt.Sprintf(`
	fair_queue {
		name kv
		kv_tokens %d
		max_wait 2m
		redis redis://%s/0
	}`, capacity, rds.Addr()))
	caddies := []*harness.Caddy{harness.StartCaddy(t, "caddy-0", site, harness.CaddyOptions{}), harness.StartCaddy(t, "caddy-1", site, harness.CaddyOptions{})}
	client := newClient(t)
	chats := mixedChats(40, 7)
	results := make([]<-chan Result, len(chats))
	for i, k := range chats {
		results[i] = k.sendAsync(context.Background(), client, caddies[i%2].URL())
	}
	for i := range chats {
		r := await(t, results[i], 3*time.Minute)
		require.NoError(t, r.Err, "client %d", i)
		require.Equal(t, http.StatusOK, r.Status, "client %d: %s", i, r)
	}
	assert.LessOrEqual(t, g.peakHeld(), capacity, "the tokens the upstream held at once")
	assert.Greater(t, g.peakHeld(), capacity/2, "several requests ran at once")
	assert.Len(t, g.arrivals(), len(chats))
	q := Queue{rdb: rds.Client(t), name: "kv"}
	q.awaitHolders(t, 0, 10*time.Second)
}

// kv_tokens at the size of a GPU's KV cache (the mock's GPU model, whose
// requests hold their prompt and their answer so far): under a burst of
// mixed prompts and answer lengths the GPU never preempts a request, as
// the queue never lets it hold more than its cache.
func TestKVTokensAtTheGPUsCacheSizeNeverPreempt(t *testing.T) {
	t.Parallel() // its own Caddy and upstream: it waits on them, not on the CPU
	const capacity = 2000
	g, mock, upstream := startGauged(t, mockllm.Config{GPU: mockllm.GPUConfig{KVTokens: capacity, Seed: 3}})
	site := proxySite(upstream, fmt.Sprintf(`
	fair_queue {
		name kvgpu
		kv_tokens %d
		max_wait 2m
	}`, capacity))
	c := harness.StartCaddy(t, "caddy", site, harness.CaddyOptions{})
	client := newClient(t)
	rng := rand.New(rand.NewPCG(5, 1))
	var results []<-chan Result
	for i := range 24 {
		k := kvChat{seq: strconv.Itoa(i), text: 400 + rng.IntN(2000), maxTokens: 30 + rng.IntN(200)}
		results = append(results, k.sendAsync(context.Background(), client, c.URL()))
	}
	for i, ch := range results {
		r := await(t, ch, 3*time.Minute)
		require.Equal(t, http.StatusOK, r.Status, "client %d: %s", i, r)
	}
	st := mock.Stats().GPU
	require.NotNil(t, st)
	assert.Zero(t, st.Preemptions, "preemptions")
	assert.LessOrEqual(t, st.MaxKVUsed, capacity)
	assert.Greater(t, st.MaxRunning, 1, "several requests ran at once")
	assert.LessOrEqual(t, g.peakHeld(), capacity)
	t.Logf("GPU: at most %d running, %d KV tokens used (of %d); weights held at most %d", st.MaxRunning, st.MaxKVUsed, capacity, g.peakHeld())
}

// A pool of two replicas of 600 and 300 tokens, two instances: neither
// replica ever holds more than its own tokens.
func TestKVTokensBoundEachReplicaOfAPool(t *testing.T) {
	rds := redistest.Start(t)
	capacity := []int{600, 300}
	var gauges []*kvGauge
	var b strings.Builder
	b.WriteString("\tfair_queue {\n\t\tname kvpool\n\t\tmax_wait 2m\n")
	for _, c := range capacity {
		g, _, addr := startGauged(t, mockllm.Config{Tokens: 4, Delay: 25 * time.Millisecond})
		gauges = append(gauges, g)
		fmt.Fprintf(&b, "\t\tupstream %s 16 kv_tokens %d\n", addr, c)
	}
	fmt.Fprintf(&b, "\t\tredis redis://%s/0\n\t}\n", rds.Addr())
	b.WriteString("\treverse_proxy {\n\t\tdynamic fair_queue\n\t\tflush_interval -1\n\t}")
	caddies := []*harness.Caddy{harness.StartCaddy(t, "caddy-0", b.String(), harness.CaddyOptions{}), harness.StartCaddy(t, "caddy-1", b.String(), harness.CaddyOptions{})}
	client := newClient(t)
	chats := mixedChats(40, 11)
	results := make([]<-chan Result, len(chats))
	for i, k := range chats {
		results[i] = k.sendAsync(context.Background(), client, caddies[i%2].URL())
	}
	for i := range chats {
		r := await(t, results[i], 3*time.Minute)
		require.NoError(t, r.Err, "client %d", i)
		require.Equal(t, http.StatusOK, r.Status, "client %d: %s", i, r)
	}
	served := 0
	for i, g := range gauges {
		assert.LessOrEqual(t, g.peakHeld(), capacity[i], "replica %d: the tokens it held at once", i)
		served += len(g.arrivals())
		t.Logf("replica %d (%d tokens): served %d, peak %d", i, capacity[i], len(g.arrivals()), g.peakHeld())
	}
	assert.Equal(t, len(chats), served)
	metrics := scrape(t, caddies...)
	assert.Contains(t, metrics, "caddy_fair_queue_upstream_kv_tokens_capacity")
}

// FIFO with weights: a heavy request at the head that does not fit
// waits for room, and the light ones behind it, which would fit beside
// the running one, wait behind it: the heavy one reaches the upstream
// first, runs alone (nothing fits beside it), and the light ones come
// after it ends.
func TestKVTokensKeepFIFOExactBehindAHeavyHead(t *testing.T) {
	const capacity = 1000
	g, _, upstream := startGauged(t, mockllm.Config{Tokens: 2, Delay: 20 * time.Millisecond})
	site := proxySite(upstream, fmt.Sprintf(`
	fair_queue {
		name kvfifo
		kv_tokens %d
		max_wait 1m
	}`, capacity))
	c := harness.StartCaddy(t, "caddy", site, harness.CaddyOptions{})
	client := newClient(t)

	// The first holds 600 tokens for 1.5s.
	first := kvChat{seq: "first", text: 400, maxTokens: 500, tokens: 1, delay: 1500 * time.Millisecond}.sendAsync(context.Background(), client, c.URL())
	c.WaitQueue("kvfifo", 0, 1, 10*time.Second)
	heavy := kvChat{seq: "heavy", text: 400, maxTokens: 890}.sendAsync(context.Background(), client, c.URL()) // 990: no room
	c.WaitQueue("kvfifo", 1, 1, 10*time.Second)
	var light []<-chan Result
	for i := range 3 {
		k := kvChat{seq: fmt.Sprintf("light-%d", i), text: 40, maxTokens: 10} // 20: room, but behind heavy
		light = append(light, k.sendAsync(context.Background(), client, c.URL()))
		c.WaitQueue("kvfifo", 2+i, 1, 10*time.Second)
	}
	for _, ch := range append([]<-chan Result{first, heavy}, light...) {
		r := await(t, ch, time.Minute)
		require.Equal(t, http.StatusOK, r.Status, "%s", r)
	}
	arrivals := g.arrivals()
	require.Len(t, arrivals, 5)
	assert.Equal(t, "first", arrivals[0].seq)
	assert.Equal(t, "heavy", arrivals[1].seq, "nothing passed the heavy head")
	assert.Zero(t, arrivals[1].others, "the heavy one waited for the first to end")
	for _, a := range arrivals[2:] {
		assert.True(t, strings.HasPrefix(a.seq, "light-"), a.seq)
		assert.Less(t, a.others, 100, "%s came after the heavy one ended", a.seq)
	}
	assert.LessOrEqual(t, g.peakHeld(), capacity)
}

// Fair order with a heavy tenant: while a light tenant keeps the upstream
// busy, the heavy tenant's one request, which needs nearly all the
// capacity, is passed by at most fairqueue.TokenPasses light grants,
// then served once the running light ones end.
func TestKVTokensServeAHeavyRequestWithinItsBoundWhileLightOnesArrive(t *testing.T) {
	const capacity, loops = 1000, 4
	g, _, upstream := startGauged(t, mockllm.Config{Tokens: 4, Delay: 50 * time.Millisecond})
	site := proxySite(upstream, fmt.Sprintf(`
	fair_queue {
		name kvfair
		kv_tokens %d
		max_wait 1m
		tenant {http.request.header.X-Tenant}
	}`, capacity))
	c := harness.StartCaddy(t, "caddy", site, harness.CaddyOptions{})
	client := newClient(t)
	ctx, stop := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	var lightServed sync.Map
	for l := range loops {
		wg.Go(func() {
			for i := 0; ctx.Err() == nil; i++ {
				k := kvChat{seq: fmt.Sprintf("light-%d-%d", l, i), text: 400, maxTokens: 100, tenant: "light"} // 200
				if r := k.send(ctx, client, c.URL()); r.Status == http.StatusOK {
					lightServed.Store(k.seq, true)
				}
			}
		})
	}
	require.True(t, eventually(10*time.Second, func() bool { return len(g.arrivals()) >= 2*loops }), "light traffic runs")
	sent := len(g.arrivals())
	start := time.Now()
	r := kvChat{seq: "heavy", text: 400, maxTokens: 800, tenant: "heavy"}.send(context.Background(), client, c.URL()) // 900
	waited := time.Since(start)
	require.Equal(t, http.StatusOK, r.Status, "%s", r)
	passed := -1
	for i, a := range g.arrivals()[sent:] {
		if a.seq == "heavy" {
			passed = i
			assert.Zero(t, a.others, "it runs alone: nothing else fits beside it")
			break
		}
	}
	require.GreaterOrEqual(t, passed, 0, "the heavy request reached the upstream")
	assert.True(t, eventually(10*time.Second, func() bool { return len(g.arrivals())-sent > passed+1+loops }),
		"light requests go on after it")
	stop()
	wg.Wait()
	// Light requests granted before it joined may reach the upstream
	// after it joined: at most one per loop.
	assert.LessOrEqual(t, passed, fairqueue.TokenPasses+loops, "light grants that passed the heavy request")
	assert.Less(t, waited, 10*time.Second, "the heavy request's wait")
	assert.LessOrEqual(t, g.peakHeld(), capacity)
	t.Logf("heavy: passed by %d light requests, waited %v", passed, waited.Round(time.Millisecond))
}

// A request heavier than the whole capacity is clamped to it: it waits
// for the running ones to end, runs alone, and is counted.
func TestKVTokensClampARequestHeavierThanTheCapacity(t *testing.T) {
	const capacity = 1000
	g, _, upstream := startGauged(t, mockllm.Config{Tokens: 2, Delay: 20 * time.Millisecond})
	site := proxySite(upstream, fmt.Sprintf(`
	fair_queue {
		name kvclamp
		kv_tokens %d
		max_wait 1m
	}`, capacity))
	c := harness.StartCaddy(t, "caddy", site, harness.CaddyOptions{})
	client := newClient(t)

	running := kvChat{seq: "running", text: 400, maxTokens: 100, tokens: 1, delay: time.Second}.sendAsync(context.Background(), client, c.URL())
	c.WaitQueue("kvclamp", 0, 1, 10*time.Second)
	huge := kvChat{seq: "huge", text: 400, maxTokens: 5000, tokens: 1, delay: time.Second}.sendAsync(context.Background(), client, c.URL())
	c.WaitQueue("kvclamp", 1, 1, 10*time.Second)
	after := kvChat{seq: "after", text: 40, maxTokens: 10}.sendAsync(context.Background(), client, c.URL())
	c.WaitQueue("kvclamp", 2, 1, 10*time.Second)
	for _, ch := range []<-chan Result{running, huge, after} {
		r := await(t, ch, time.Minute)
		require.Equal(t, http.StatusOK, r.Status, "%s", r)
	}
	arrivals := g.arrivals()
	require.Len(t, arrivals, 3)
	assert.Equal(t, "huge", arrivals[1].seq)
	assert.Zero(t, arrivals[1].others, "the clamped request runs alone")
	assert.Equal(t, "after", arrivals[2].seq)
	assert.Zero(t, arrivals[2].others, "nothing runs beside it")
	assert.Equal(t, 1, sumMetric(scrape(t, c), "caddy_fair_queue_kv_clamped_total", `queue="kvclamp"`))
}

// The queue learns its bytes per token from the answers' usage, and the
// admin API and the metrics show it.
func TestKVEstimatorLearnsFromUsageAndShowsInTheAdminAPI(t *testing.T) {
	_, _, upstream := startGauged(t, mockllm.Config{Tokens: 2, Delay: time.Millisecond})
	site := proxySite(upstream, `
	fair_queue {
		name kvlearn
		kv_tokens 100000
	}`)
	c := harness.StartCaddy(t, "caddy", site, harness.CaddyOptions{})
	client := newClient(t)
	const n, text = 5, 4000
	k := kvChat{text: text, maxTokens: 10}
	for i := range n {
		k.seq = strconv.Itoa(i)
		r := k.send(context.Background(), client, c.URL())
		require.Equal(t, http.StatusOK, r.Status, "%s", r)
	}
	// The mock's prompt_tokens: the body's bytes / 4, rounded up.
	msgs, _ := json.Marshal([]map[string]string{{"role": "user", "content": strings.Repeat("x", text)}})
	used := float64((len(fmt.Sprintf(`{"model":"mock","max_tokens":%d,"messages":%s}`, k.maxTokens, msgs)) + 3) / 4)
	// The estimator's moving averages, from the seed of 4 bytes per token:
	// the i-th answer weighs 1/(i+10) while that is above 0.01.
	avgBytes, avgTokens := 4*used, used
	for i := range n {
		alpha := max(0.01, 1/float64(i+10))
		avgBytes += alpha * (text - avgBytes)
		avgTokens += alpha * (used - avgTokens)
	}
	want := avgBytes / avgTokens

	var kv struct {
		BytesPerToken float64 `json:"bytes_per_token"`
		Samples       int64   `json:"samples"`
		Capacity      int     `json:"capacity"`
		TokensHeld    int     `json:"tokens_held"`
	}
	require.True(t, eventually(5*time.Second, func() bool {
		// The last request's tokens are given back just after it is learned.
		return adminKV(c, &kv) && kv.Samples == n && kv.TokensHeld == 0
	}), "the admin API shows %d samples and no tokens held (last: %+v)", n, kv)
	assert.InDelta(t, want, kv.BytesPerToken, 1e-9)
	assert.Less(t, kv.BytesPerToken, 4.0, "the body's JSON is counted by the mock, not by the estimate")
	assert.Equal(t, 100000, kv.Capacity)
	metrics := scrape(t, c)
	assert.Contains(t, metrics, `caddy_fair_queue_kv_bytes_per_token{queue="kvlearn"}`)
	assert.Contains(t, metrics, `caddy_fair_queue_kv_tokens_capacity{queue="kvlearn"} 100000`)
}
