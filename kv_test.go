package caddyfairqueue

import (
	"context"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
	"github.com/fair-queue/caddy-fair-queue/internal/jsonscan"
	"github.com/fair-queue/caddy-fair-queue/internal/mockllm"
	"github.com/fair-queue/caddy-fair-queue/internal/redistest"
)

func TestCaddyfileParsesTheTokenOptions(t *testing.T) {
	h, err := parse("fair_queue {\nkv_tokens 200000\ndefault_max_tokens 512\n}")
	require.NoError(t, err, "kv_tokens alone bounds a queue: permits may be left out")
	assert.Equal(t, 200000, h.KVTokens)
	assert.Equal(t, 512, h.DefaultMaxTokens)
	assert.Equal(t, "kv_tokens (1 and 2)", (&Handler{KVTokens: 1}).settings().diff((&Handler{KVTokens: 2}).settings()))

	h, err = parse("fair_queue {\nupstream a:1 4 kv_tokens 1000\nupstream b:1 2 kv_tokens 500\n}")
	require.NoError(t, err)
	assert.Equal(t, []fairqueue.Upstream{{Dial: "a:1", Permits: 4, KVTokens: 1000}, {Dial: "b:1", Permits: 2, KVTokens: 500}}, h.Upstreams)
	assert.True(t, h.countsTokens())
	w, clamped := h.settings().config().ClampTokens(5000)
	assert.Equal(t, 1000, w, "a request heavier than every replica is clamped to the largest")
	assert.True(t, clamped)

	h, err = parse("fair_queue {\npermits 2\n}")
	require.NoError(t, err)
	assert.False(t, h.countsTokens())
	assert.Equal(t, DefaultMaxTokens, h.defaultMaxTokens())
}

func TestCaddyfileRefusesBadTokenOptionsNamingTheLine(t *testing.T) {
	for _, tc := range []struct {
		name, body, wantErr string
	}{
		{"kv_tokens zero", "kv_tokens 0", "kv_tokens must be at least 1, got 0"},
		{"kv_tokens not a number", "kv_tokens lots", "kv_tokens: 'lots' is not an integer"},
		{"kv_tokens twice", "kv_tokens 1\nkv_tokens 2", "subdirective 'kv_tokens' is given twice"},
		{"default_max_tokens zero", "kv_tokens 10\ndefault_max_tokens 0", "default_max_tokens must be at least 1, got 0"},
		{"default_max_tokens without tokens", "permits 1\ndefault_max_tokens 10", "default_max_tokens requires kv_tokens (on the queue or an upstream) or cost tokens"},
		{"upstream kv_tokens zero", "upstream a:1 1 kv_tokens 0", "upstream a:1: kv_tokens must be at least 1, got 0"},
		{"upstream kv_tokens not a number", "upstream a:1 1 kv_tokens many", "upstream a:1: kv_tokens 'many' is not an integer"},
		{"upstream unknown option", "upstream a:1 1 tokens 5", "upstream a:1: unknown option 'tokens' (want kv_tokens)"},
		{"upstream kv_tokens without value", "upstream a:1 1 kv_tokens", "wrong argument count"},
		{"kv_tokens on some upstreams", "upstream a:1 1 kv_tokens 10\nupstream b:1 1", "kv_tokens is set on 1 of the 2 upstreams, not on upstream b:1: set it on every upstream, or kv_tokens on the queue too"},
		{"kv_tokens above the pool", "kv_tokens 30\nupstream a:1 1 kv_tokens 10\nupstream b:1 1 kv_tokens 10", "kv_tokens (30) is more than the upstreams' kv_tokens together (20)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := parse("fair_queue {\n" + tc.body + "\n}")
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.wantErr)
			assert.Contains(t, err.Error(), "Testfile:", "the error carries the file and line")
		})
	}
	// Some upstreams with kv_tokens and the queue's own: each counts.
	_, err := parse("fair_queue {\nkv_tokens 15\nupstream a:1 1 kv_tokens 10\nupstream b:1 1\n}")
	require.NoError(t, err)
}

func TestJSONConfigErrorsOfTheTokenOptionsNameTheField(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	for _, tc := range []struct {
		name, fields, want string
	}{
		{"kv_tokens negative", `"permits":1,"kv_tokens":-1`, `kv_tokens must be >= 0, got -1`},
		{"kv_tokens a string", `"kv_tokens":"many"`, `kv_tokens: want an integer, got a string`},
		{"upstream kv_tokens negative", `"upstreams":[{"dial":"a:1","permits":1,"kv_tokens":-5}]`, `upstreams[0].kv_tokens: must be >= 0, got -5`},
		{"upstream kv_tokens a string", `"upstreams":[{"dial":"a:1","permits":1,"kv_tokens":"x"}]`, `upstreams[0].kv_tokens: want an integer, got a string`},
		{"upstream kv_tokens on some", `"upstreams":[{"dial":"a:1","permits":1,"kv_tokens":10},{"dial":"b:1","permits":1}]`, `upstreams[1].kv_tokens: is set on 1 of the 2 upstreams, not on this one (b:1)`},
		{"default_max_tokens negative", `"kv_tokens":10,"default_max_tokens":-1`, `default_max_tokens must be at least 1, got -1`},
		{"default_max_tokens typo", `"kv_tokens":10,"default_max_token":5`, `(did you mean "default_max_tokens"?)`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := loadHandlerJSON(t, tc.fields)
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.want)
		})
	}
	require.NoError(t, loadHandlerJSON(t, `"kv_tokens":100000,"default_max_tokens":256`))
}

func TestWeightIsThePromptEstimatePlusTheBudget(t *testing.T) {
	chat := func(text, extra string) string {
		return `{"model":"m",` + extra + `"messages":[{"role":"user","content":"` + text + `"}]}`
	}
	for _, tc := range []struct {
		name   string
		body   string
		api    api
		ratio  float64
		prompt int64
		budget int64
	}{
		{"prompt text / 4, rounded up, plus max_tokens", chat(strings.Repeat("a", 401), `"max_tokens":50,`), apiOpenAI, 4, 101, 50},
		{"max_completion_tokens before max_tokens", chat("abcd", `"max_tokens":50,"max_completion_tokens":70,`), apiOpenAI, 4, 1, 70},
		{"no budget: default_max_tokens", chat(strings.Repeat("a", 400), ""), apiOpenAI, 4, 100, 300},
		{"a learned ratio", chat(strings.Repeat("a", 400), `"max_tokens":1,`), apiOpenAI, 3, 134, 1},
		{"Ollama generate: prompt, system and num_predict", `{"prompt":"` + strings.Repeat("p", 40) + `","system":"` + strings.Repeat("s", 40) + `","options":{"num_predict":9}}`, apiOllamaGenerate, 4, 20, 9},
		{"no prompt key: the whole body", `{"tools":"` + strings.Repeat("x", 96) + `"}`, apiOpenAI, 4, 27, 300},
		{"Responses API input", `{"input":"` + strings.Repeat("x", 96) + `","max_output_tokens":5}`, apiOpenAI, 4, 24, 5},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := newWeight(jsonscan.Sniff([]byte(tc.body)), tc.api, len(tc.body), 300, DefaultMediaTokens)
			w.estimate(tc.ratio)
			assert.Equal(t, tc.prompt, w.prompt)
			assert.Equal(t, tc.budget, w.budget)
			assert.Equal(t, int(tc.prompt+tc.budget), w.tokens())
		})
	}
	huge := newWeight(jsonscan.Fields{Prompt: true, PromptBytes: 4, Budget: jsonscan.MaxTokenCount}, apiOpenAI, 0, 1, DefaultMediaTokens)
	huge.estimate(4)
	assert.Equal(t, int(jsonscan.MaxTokenCount), huge.tokens(), "saturated")
}

func TestPromptEstimatorLearnsBytesPerTokenWithinBounds(t *testing.T) {
	var e promptEstimator
	ratio, n := e.state()
	assert.Equal(t, 4.0, ratio, "the seed: 4 bytes per token")
	assert.Zero(t, n)
	e.observe(300, 100) // 3 bytes per token
	ratio, n = e.state()
	assert.InDelta(t, (0.9*400+0.1*300)/100, ratio, 1e-9, "the first answer moves the ratio by alpha")
	assert.Equal(t, int64(1), n)
	for range 2000 { // the averages span 100 answers, the seed's share fades
		e.observe(3000, 1000)
	}
	assert.InDelta(t, 3, e.bytesPerToken(), 1e-6, "learned")
	// Samples out of bounds are left out: a cached prefix (too few
	// tokens), a chat template that dwarfs a short text, nonsense.
	for _, s := range []struct {
		text   int64
		tokens float64
	}{{1000, 10}, {5, 30}, {0, 10}, {10, 0}, {10, math.Inf(1)}, {10, math.NaN()}} {
		e.observe(s.text, s.tokens)
	}
	ratio, n = e.state()
	assert.InDelta(t, 3, ratio, 1e-6)
	assert.Equal(t, int64(2001), n)
	// Large prompts weigh more than small ones.
	var f promptEstimator
	f.observe(8000, 1000) // 8
	f.observe(20, 10)     // 2
	assert.Greater(t, f.bytesPerToken(), 4.0)
}

func TestUsageWriterReadsThePromptTokens(t *testing.T) {
	for _, tc := range []struct {
		name, contentType string
		chunks            []string
		want              float64
		found             bool
	}{
		{"OpenAI JSON", "application/json", []string{`{"usage":{"prompt_tokens":12,"completion_tokens":30,"total_tokens":42}}`}, 12, true},
		{"OpenAI stream", "text/event-stream", []string{"data: {\"choices\":[]}\n\n", "data: {\"usage\":{\"prompt_tokens\":20,\"total_tokens\":37}}\n\n", "data: [DONE]\n\n"}, 20, true},
		{"Responses API", "application/json", []string{`{"response":{"usage":{"input_tokens":9,"output_tokens":1,"total_tokens":10}}}`}, 9, true},
		{"Ollama NDJSON", "application/x-ndjson", []string{`{"done":false}` + "\n", `{"done":true,"prompt_eval_count":26,"eval_count":5}` + "\n"}, 26, true},
		{"Ollama's long last line", "application/x-ndjson", []string{`{"done":true,"context":[` + strings.Repeat("1,", 40000) + `1],"prompt_eval_count":33,"eval_count":2}` + "\n"}, 33, true},
		{"no prompt count", "application/json", []string{`{"usage":{"total_tokens":42}}`}, 0, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, found := answered(t, tc.contentType, tc.chunks...).promptTokens()
			assert.Equal(t, tc.found, found)
			assert.Equal(t, tc.want, got)
		})
	}
}

func TestQueueLearnsItsPromptEstimateAndShowsIt(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	h := provisionLocal(t, newContext(t), &Handler{Name: "kv-learn", KVTokens: 100000, DefaultMaxTokens: 100})
	mock := mockllm.New(mockllm.Config{Delay: -1})
	srv := serve(t, h, proxyTo(t, mock.Handler()))
	text := strings.Repeat("a", 4000)
	body := `{"model":"m","max_tokens":50,"messages":[{"role":"user","content":"` + text + `"}]}`
	resp := srv.post(t, context.Background(), body)
	_, _ = io.ReadAll(resp.Body)
	assert.Equal(t, outcomeGranted, srv.outcome(t))
	settled(t, h)

	// The mock counts ceil(body bytes / 4) prompt tokens.
	used := float64((len(body) + 3) / 4)
	e := h.engineList()[0]
	ratio, n := e.kv.state()
	assert.Equal(t, int64(1), n)
	assert.InDelta(t, (0.9*4*used+0.1*4000)/used, ratio, 1e-9)
	assert.Zero(t, e.tokens.Load(), "the request's tokens are given back")

	st := queueStatus(context.Background())
	require.Len(t, st.Queues, 1)
	require.NotNil(t, st.Queues[0].KV)
	assert.Equal(t, kvReport{BytesPerToken: ratio, Samples: 1, Capacity: 100000}, *st.Queues[0].KV)

	// A request heavier than the capacity is clamped, and counted.
	before := testutil.ToFloat64(metrics.kvClamped.WithLabelValues("kv-learn"))
	resp = srv.post(t, context.Background(), `{"model":"m","max_tokens":200000,"messages":[]}`)
	_, _ = io.ReadAll(resp.Body)
	assert.Equal(t, outcomeGranted, srv.outcome(t))
	assert.Equal(t, before+1, testutil.ToFloat64(metrics.kvClamped.WithLabelValues("kv-learn")))
	settled(t, h)
}

// Needs the engine's token count (Cluster.TokensHeld) for kv_tokens_held.
func TestTokenGaugesShowHeldCapacityAndEstimate(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	const name = "kv-gauges"
	ctx := newContext(t)
	h := &Handler{Name: name, KVTokens: 1000, MaxWait: caddy.Duration(time.Second),
		PollInterval: caddy.Duration(50 * time.Millisecond), Lease: caddy.Duration(time.Second)}
	require.NoError(t, h.Provision(ctx))
	t.Cleanup(func() { _ = h.Cleanup() })
	reg := ctx.GetMetricsRegistry()
	value := func(metric string) (float64, bool) { return gauge(t, reg, "caddy_fair_queue_"+metric, name) }

	next := newHolder()
	body := `{"max_tokens":100,"messages":[{"role":"user","content":"` + strings.Repeat("a", 400) + `"}]}`
	a := newRequest(context.Background(), body).start(h, next)
	next.waitEntered(t)
	e := h.engineList()[0]
	assert.Equal(t, int64(200), e.tokens.Load(), "this instance's running tokens: 400/4 + 100")
	v, ok := value("kv_tokens_capacity")
	assert.True(t, ok)
	assert.Equal(t, 1000.0, v)
	v, ok = value("kv_bytes_per_token")
	assert.True(t, ok)
	assert.Equal(t, 4.0, v)
	assert.Eventually(t, func() bool { v, ok := value("kv_tokens_held"); return ok && v == 200 },
		5*time.Second, 20*time.Millisecond, "the cluster's tokens held, from the heartbeat")
	next.release <- struct{}{}
	a.wait(t)
	settled(t, h)
	assert.Zero(t, e.tokens.Load())
}

func TestEmbeddingsHaveNoCompletionBudget(t *testing.T) {
	for path, want := range map[string]bool{
		"/v1/embeddings": true, "/v1/embeddings/": true, "/api/embed": true, "/api/embeddings": true,
		"/v1/score": true, "/rerank": true, "/classify": true, "/pooling": true,
		"/v1/chat/completions": false, "/api/chat": false, "/api/generate": false,
	} {
		r := httptest.NewRequest(http.MethodPost, path, nil)
		assert.Equal(t, want, generatesNone(r, apiOf(r)), path)
	}
	body := `{"model":"e","input":"` + strings.Repeat("x", 40) + `"}`
	w := newWeight(jsonscan.Sniff([]byte(body)), apiOpenAI, len(body), 0, DefaultMediaTokens)
	w.estimate(4)
	assert.Equal(t, 10, w.tokens(), "the input's tokens alone")
}

// A reload that moves a queue to another store: the new queue counts the
// tokens of the old one's running requests against its capacity, so a
// request that does not fit beside them waits until they end.
func TestARetiredQueuesRunningTokensHoldBackItsSuccessor(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	rds := redistest.Start(t)
	old := provisionLocal(t, newContext(t), &Handler{Name: "kv-switch", KVTokens: 1000})
	next := newHolder()
	body := `{"max_tokens":200,"messages":[{"role":"user","content":"` + strings.Repeat("a", 400) + `"}]}` // 300
	var running []*request
	for range 3 {
		running = append(running, newRequest(context.Background(), body).start(old, next))
		next.waitEntered(t)
	}
	retired := old.engineList()[0]
	require.NoError(t, old.Cleanup()) // the reload drops the old config
	cur := provision(t, newContext(t), rds.Addr(), &Handler{Name: "kv-switch", KVTokens: 1000})
	waiting := newRequest(context.Background(), body).start(cur, next)
	require.Eventually(t, func() bool { return len(cur.engineList()) == 1 }, 5*time.Second, 5*time.Millisecond)
	assert.Equal(t, 900, cur.engineList()[0].reservedTokens(), "the old queue's running tokens")
	early := false
	select {
	case <-next.entered:
		early = true
		t.Error("granted beside the old queue's 900 tokens: 1200 of 1000")
	case <-time.After(500 * time.Millisecond):
	}
	next.release <- struct{}{} // one old request ends: 600 reserved, 300 fit
	if !early {
		next.waitEntered(t)
	}
	close(next.release)
	for _, r := range append(running, waiting) {
		r.wait(t)
	}
	assert.Zero(t, retired.tokens.Load())
}

// answered is a usageWriter that has passed on an answer of contentType
// written in chunks.
func answered(t *testing.T, contentType string, chunks ...string) *usageWriter {
	t.Helper()
	u := newUsageWriter(httptest.NewRecorder())
	u.Header().Set("Content-Type", contentType)
	u.WriteHeader(http.StatusOK)
	for _, c := range chunks {
		_, err := u.Write([]byte(c))
		require.NoError(t, err)
	}
	return u
}
