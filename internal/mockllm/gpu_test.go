package mockllm

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The model's tests step it with a clock of their own: each step moves
// it by the step's duration, so nothing depends on the machine's speed.

// testGPU is a model with round step times: 10ms a step, 1ms a sequence,
// 0.1ms a prefill token.
func testGPU(kv int, edit ...func(*GPUConfig)) *gpuModel {
	cfg := GPUConfig{KVTokens: kv, StepBase: 10 * time.Millisecond, StepPerSeq: time.Millisecond,
		PrefillPerToken: 100 * time.Microsecond, MaxBatchedTokens: 1 << 20}
	for _, e := range edit {
		e(&cfg)
	}
	return newGPUModel(cfg)
}

// stepper drives a model with a virtual clock and checks the cache after
// every step.
type stepper struct {
	t   *testing.T
	m   *gpuModel
	now time.Time
}

func newStepper(t *testing.T, m *gpuModel) *stepper {
	return &stepper{t: t, m: m, now: time.Unix(1_700_000_000, 0)}
}

func (st *stepper) add(prompt, want int) *seq {
	st.t.Helper()
	s, err := st.m.add(prompt, want, st.now)
	require.NoError(st.t, err)
	return s
}

// step runs one step and returns its duration (0: nothing ran).
func (st *stepper) step() time.Duration {
	st.t.Helper()
	d, ok := st.m.begin()
	if !ok {
		return 0
	}
	st.checkCache()
	st.now = st.now.Add(d)
	st.m.finish(st.now)
	st.checkCache()
	return d
}

// drain steps until nothing waits or runs (at most n steps).
func (st *stepper) drain(n int) {
	st.t.Helper()
	for i := 0; i < n && !st.m.idle(); i++ {
		st.step()
	}
	require.True(st.t, st.m.idle(), "still busy after %d steps", n)
}

// checkCache asserts the KV accounting: the tokens held are the sum of
// what each running sequence holds, never above the cache.
func (st *stepper) checkCache() {
	st.t.Helper()
	sum := 0
	for _, s := range st.m.running {
		sum += s.computed + s.scheduled
		require.LessOrEqual(st.t, s.computed, s.known())
	}
	for _, s := range st.m.waiting {
		require.Zero(st.t, s.computed+s.scheduled, "a waiting sequence holds no tokens")
	}
	require.Equal(st.t, sum, st.m.used, "KV tokens held")
	require.LessOrEqual(st.t, st.m.used, st.m.cfg.KVTokens, "KV tokens above the cache")
	require.LessOrEqual(st.t, len(st.m.running), st.m.cfg.MaxNumSeqs)
}

func TestGPUPrefillTimeIsProportionalToThePromptTokens(t *testing.T) {
	for _, prompt := range []int{1, 1000, 2000} {
		st := newStepper(t, testGPU(10_000))
		st.add(prompt, 2)
		// The first step computes the prompt and makes the first token.
		want := 10*time.Millisecond + time.Millisecond + time.Duration(prompt-1)*100*time.Microsecond
		assert.Equal(t, want, st.step(), "prompt %d", prompt)
		assert.Equal(t, 11*time.Millisecond, st.step(), "a decode step of one sequence")
	}
}

func TestGPUStepTimeGrowsWithTheBatch(t *testing.T) {
	for _, n := range []int{1, 8, 64} {
		st := newStepper(t, testGPU(100_000))
		for range n {
			st.add(10, 5)
		}
		st.step() // the prefills
		assert.Equal(t, 10*time.Millisecond+time.Duration(n)*time.Millisecond, st.step(), "batch of %d", n)
		assert.Len(t, st.m.running, n)
	}
}

func TestGPUTimeToFirstTokenGrowsWithTheBatchAhead(t *testing.T) {
	ttft := func(ahead int) time.Duration {
		st := newStepper(t, testGPU(100_000))
		for range ahead {
			st.add(100, 1000)
		}
		st.step()
		st.step()
		s := st.add(100, 3)
		for s.made == 0 {
			st.step()
		}
		return s.ttft
	}
	alone, behind8, behind64 := ttft(0), ttft(8), ttft(64)
	assert.Equal(t, 10*time.Millisecond+time.Millisecond+99*100*time.Microsecond, alone)
	assert.Less(t, alone, behind8)
	assert.Less(t, behind8, behind64)
	// Its first step holds the others' decode and its own prefill.
	assert.Equal(t, 10*time.Millisecond+65*time.Millisecond+99*100*time.Microsecond, behind64)
}

func TestGPURequestsBeyondMaxNumSeqsWaitInTheServerInArrivalOrder(t *testing.T) {
	st := newStepper(t, testGPU(100_000, func(c *GPUConfig) { c.MaxNumSeqs = 2 }))
	var seqs []*seq
	for i := range 5 {
		seqs = append(seqs, st.add(10, max(2, 10*i)))
	}
	st.step()
	assert.Equal(t, []*seq{seqs[0], seqs[1]}, st.m.running)
	assert.Equal(t, seqs[2:], st.m.waiting)
	st.step() // seqs[0] makes its second and last token
	assert.True(t, seqs[0].done)
	st.step() // its place goes to the oldest waiting
	assert.Equal(t, []*seq{seqs[1], seqs[2]}, st.m.running)
	st.drain(100)
	for _, s := range seqs {
		assert.Equal(t, s.want, s.made)
	}
	assert.Zero(t, st.m.used)
	assert.EqualValues(t, 5, st.m.totals.Finished)
}

func TestGPUFullCachePreemptsTheNewestRunningRequest(t *testing.T) {
	// 3 sequences of 30 prompt tokens fill 90 of 100 tokens; each decode
	// step adds 3 until the 4th would overflow.
	st := newStepper(t, testGPU(100))
	a, b, c := st.add(30, 20), st.add(30, 20), st.add(30, 20)
	for range 4 {
		st.step()
	}
	assert.Zero(t, st.m.totals.Preemptions)
	assert.Equal(t, 99, st.m.used)
	st.step()
	assert.EqualValues(t, 1, st.m.totals.Preemptions)
	assert.Equal(t, 1, c.preempted, "the newest is preempted")
	assert.Zero(t, a.preempted+b.preempted)
	assert.Equal(t, []*seq{c}, st.m.waiting)
	assert.Equal(t, 4, c.made, "it keeps the tokens it sent")
	assert.Equal(t, 68, st.m.used, "its 33 tokens are freed")

	st.drain(1000)
	for _, s := range []*seq{a, b, c} {
		assert.Equal(t, 20, s.made)
		assert.True(t, s.done)
	}
	assert.Zero(t, st.m.used)
	// It computed its 33 tokens again once readmitted.
	assert.EqualValues(t, 3*(30+20-1)+33, st.m.totals.ComputedTokens)
	assert.EqualValues(t, 60, st.m.totals.GenerationTokens)
}

func TestGPUCacheNeverOverflowsUnderAMixedLoad(t *testing.T) {
	st := newStepper(t, testGPU(4000, func(c *GPUConfig) { c.MaxBatchedTokens = 512; c.MaxNumSeqs = 16 }))
	var seqs []*seq
	for i := range 60 {
		prompt := 50 + (i*97)%900
		if i%10 == 3 {
			prompt = 3000 // a long context, in chunks of 512
		}
		seqs = append(seqs, st.add(prompt, 10+(i*31)%300))
		st.step()
	}
	st.drain(100_000)
	assert.Positive(t, st.m.totals.Preemptions)
	for _, s := range seqs {
		assert.Equal(t, s.want, s.made)
	}
	assert.LessOrEqual(t, st.m.maxUsed, 4000)
	assert.EqualValues(t, 60, st.m.totals.Finished)
}

func TestGPULongPromptIsComputedInChunks(t *testing.T) {
	st := newStepper(t, testGPU(100_000, func(c *GPUConfig) { c.MaxBatchedTokens = 1000 }))
	s := st.add(2500, 2)
	st.step()
	st.step()
	assert.Equal(t, 2000, s.computed)
	assert.Zero(t, s.made)
	st.step()
	assert.Equal(t, 1, s.made, "the last chunk makes the first token")
	assert.Equal(t, 10*time.Millisecond+time.Millisecond+499*100*time.Microsecond, s.ttft-2*(11*time.Millisecond+999*100*time.Microsecond))
}

func TestGPUAbortFreesTheTokensOfALeavingClient(t *testing.T) {
	st := newStepper(t, testGPU(1000, func(c *GPUConfig) { c.MaxNumSeqs = 1 }))
	a, b := st.add(100, 50), st.add(100, 50)
	st.step()
	st.m.abort(b) // waiting: gone at once
	assert.Empty(t, st.m.waiting)
	d, ok := st.m.begin()
	require.True(t, ok)
	st.m.abort(a) // mid-step: gone at its end
	st.now = st.now.Add(d)
	st.m.finish(st.now)
	assert.True(t, a.done && b.done)
	assert.Zero(t, st.m.used)
	assert.True(t, st.m.idle())
	assert.EqualValues(t, 2, st.m.totals.Aborted)
}

func TestGPUAnswerLengthsAreDrawnFromTheSeed(t *testing.T) {
	draws := func(seed uint64) []int {
		m := newGPUModel(GPUConfig{KVTokens: 100_000, Seed: seed})
		var out []int
		for range 20 {
			out = append(out, m.answerLength(10, -1))
		}
		return out
	}
	assert.Equal(t, draws(7), draws(7))
	assert.NotEqual(t, draws(7), draws(8))
	m := newGPUModel(GPUConfig{KVTokens: 1000})
	assert.Equal(t, 42, m.answerLength(10, 42))
	assert.Equal(t, 100, m.answerLength(900, 500), "at most the cache less the prompt")
}

func TestGPUMetricsMatchTheModel(t *testing.T) {
	st := newStepper(t, testGPU(100, func(c *GPUConfig) { c.MaxNumSeqs = 3 }))
	for range 4 {
		st.add(30, 20)
	}
	for range 5 {
		st.step()
	}
	g := &gpuRunner{m: st.m}
	var b strings.Builder
	writeMetrics(&b, g.metrics())
	got := parseMetrics(t, b.String())
	assert.Equal(t, float64(len(st.m.running)), got[`vllm:num_requests_running{model_name="mock"}`])
	assert.Equal(t, float64(len(st.m.waiting)), got[`vllm:num_requests_waiting{model_name="mock"}`])
	assert.Equal(t, 2.0, got[`vllm:num_requests_waiting{model_name="mock"}`], "the one beyond max_num_seqs and the one preempted")
	assert.InDelta(t, float64(st.m.used)/100, got[`vllm:kv_cache_usage_perc{model_name="mock"}`], 1e-9)
	assert.Equal(t, 1.0, got[`vllm:num_preemptions_total{model_name="mock"}`])
	assert.Equal(t, float64(st.m.totals.GenerationTokens), got[`vllm:generation_tokens_total{model_name="mock"}`])
	// 3 first tokens after one step of 10 + 3 x 1 + 87 x 0.1 = 21.7 ms.
	assert.Equal(t, 3.0, got[`vllm:time_to_first_token_seconds_count{model_name="mock"}`])
	assert.Equal(t, 0.0, got[`vllm:time_to_first_token_seconds_bucket{le="0.02",model_name="mock"}`])
	assert.Equal(t, 3.0, got[`vllm:time_to_first_token_seconds_bucket{le="0.04",model_name="mock"}`])
	assert.Equal(t, 3.0, got[`vllm:time_to_first_token_seconds_bucket{le="+Inf",model_name="mock"}`])
	assert.InDelta(t, 3*0.0217, got[`vllm:time_to_first_token_seconds_sum{model_name="mock"}`], 1e-9)
}

// parseMetrics reads Prometheus' text format: series -> value.
func parseMetrics(t *testing.T, text string) map[string]float64 {
	t.Helper()
	out := map[string]float64{}
	for line := range strings.Lines(text) {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		v, err := strconv.ParseFloat(line[i+1:], 64)
		require.NoError(t, err, line)
		out[line[:i]] = v
	}
	return out
}

// The server's tests run the model on the wall clock, fast (1 ms steps),
// and assert only what no timing changes.

func startGPUServer(t *testing.T, cfg GPUConfig) (*Server, string) {
	t.Helper()
	cfg.StepBase, cfg.StepPerSeq, cfg.PrefillPerToken = time.Millisecond, 10*time.Microsecond, time.Microsecond
	s, hs := start(t, Config{GPU: cfg})
	t.Cleanup(s.Close) // before hs.Close: the answers end
	return s, hs.URL
}

func chatBody(promptBytes, maxTokens int) string {
	return fmt.Sprintf(`{"model":"m","stream":true,"max_tokens":%d,"messages":[{"role":"user","content":%q}]}`,
		maxTokens, strings.Repeat("x", promptBytes))
}

func TestGPUServerStreamsEveryTokenThenItsUsage(t *testing.T) {
	_, url := startGPUServer(t, GPUConfig{KVTokens: 10_000})
	resp := post(t, context.Background(), url+"/v1/chat/completions", chatBody(400, 7))
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	ev := events(t, resp.Body)
	require.Len(t, ev, 7+2)
	assert.Equal(t, "[DONE]", ev[8])
	var last struct {
		Usage map[string]int `json:"usage"`
	}
	require.NoError(t, json.Unmarshal([]byte(ev[7]), &last))
	assert.Equal(t, map[string]int{"prompt_tokens": 100, "completion_tokens": 7, "total_tokens": 107}, last.Usage)

	// Unstreamed, the length drawn: the usage says it.
	resp = post(t, context.Background(), url+"/v1/completions", `{"prompt":["abcd","efgh"]}`)
	defer resp.Body.Close()
	var whole struct {
		Usage map[string]int `json:"usage"`
	}
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&whole))
	assert.Equal(t, 2, whole.Usage["prompt_tokens"])
	assert.Positive(t, whole.Usage["completion_tokens"])
}

// TestGPUServerAnswersTheHeadersLengthWithItsUsageAsOpenAI is what the
// capacity bench's clients that send no max_tokens rely on: the length
// comes from X-Mock-Tokens, and with include_usage every token chunk has
// "usage":null, then one chunk without choices carries the usage.
func TestGPUServerAnswersTheHeadersLengthWithItsUsageAsOpenAI(t *testing.T) {
	_, url := startGPUServer(t, GPUConfig{KVTokens: 10_000})
	body := fmt.Sprintf(`{"model":"m","stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":%q}]}`,
		strings.Repeat("x", 400))
	resp := post(t, context.Background(), url+"/v1/chat/completions", body, HeaderTokens, "9")
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	ev := events(t, resp.Body)
	require.Len(t, ev, 9+2, "9 tokens, the usage chunk, [DONE]")
	for _, d := range ev[:9] {
		var c map[string]json.RawMessage
		require.NoError(t, json.Unmarshal([]byte(d), &c))
		assert.Equal(t, "null", string(c["usage"]), d)
	}
	var last struct {
		Choices []any          `json:"choices"`
		Usage   map[string]int `json:"usage"`
	}
	require.NoError(t, json.Unmarshal([]byte(ev[9]), &last))
	assert.Empty(t, last.Choices)
	assert.Equal(t, 9, last.Usage["completion_tokens"])
	assert.Equal(t, 100, last.Usage["prompt_tokens"], "the prompt text's 400 bytes")
	assert.Equal(t, 109, last.Usage["total_tokens"])
	assert.Equal(t, "[DONE]", ev[10])
}

func TestGPUServerRefusesAPromptLargerThanTheCache(t *testing.T) {
	_, url := startGPUServer(t, GPUConfig{KVTokens: 100})
	resp := post(t, context.Background(), url+"/v1/chat/completions", chatBody(400, 5))
	defer resp.Body.Close()
	assert.Equal(t, http.StatusBadRequest, resp.StatusCode)
}

func TestGPUServerPreemptsUnderConcurrentLoadAndServesEveryone(t *testing.T) {
	// Two answers of 300 tokens after prompts of 200 outgrow 600 tokens:
	// a preemption whatever the order and the pace of the arrivals.
	s, url := startGPUServer(t, GPUConfig{KVTokens: 600, MaxNumSeqs: 8})
	var wg sync.WaitGroup
	counts := make([]int, 12)
	for i := range counts {
		wg.Go(func() {
			resp := post(t, context.Background(), url+"/v1/chat/completions", chatBody(800, 300))
			defer resp.Body.Close()
			sc := bufio.NewScanner(resp.Body)
			for sc.Scan() {
				if strings.Contains(sc.Text(), `"content"`) {
					counts[i]++
				}
			}
		})
	}
	wg.Wait()
	for i, n := range counts {
		assert.Equal(t, 300, n, "request %d", i)
	}
	st := s.Stats().GPU
	require.NotNil(t, st)
	assert.Positive(t, st.Preemptions)
	assert.LessOrEqual(t, st.MaxKVUsed, 600)
	assert.LessOrEqual(t, st.MaxRunning, 8)
	assert.EqualValues(t, 12, st.Finished)
	assert.Zero(t, st.KVUsed)

	resp, err := http.Get(url + "/metrics")
	require.NoError(t, err)
	defer resp.Body.Close()
	var b strings.Builder
	_, err = bufio.NewReader(resp.Body).WriteTo(&b)
	require.NoError(t, err)
	m := parseMetrics(t, b.String())
	assert.Equal(t, float64(st.Preemptions), m[`vllm:num_preemptions_total{model_name="mock"}`])
	assert.Equal(t, 12.0, m[`vllm:time_to_first_token_seconds_count{model_name="mock"}`])
	assert.Equal(t, 0.0, m[`vllm:num_requests_running{model_name="mock"}`])
}

func TestGPUServerClientLeavingFreesItsTokens(t *testing.T) {
	s, url := startGPUServer(t, GPUConfig{KVTokens: 10_000})
	ctx, cancel := context.WithCancel(context.Background())
	resp := post(t, ctx, url+"/v1/chat/completions", chatBody(400, 1_000_000))
	sc := bufio.NewScanner(resp.Body)
	require.True(t, sc.Scan()) // a first token
	cancel()
	resp.Body.Close()
	require.Eventually(t, func() bool { return s.Stats().GPU.Aborted == 1 }, 10*time.Second, 5*time.Millisecond)
	assert.Zero(t, s.Stats().GPU.KVUsed)
}

func TestGPUServerCloseEndsTheAnswersStillRunning(t *testing.T) {
	s, url := startGPUServer(t, GPUConfig{KVTokens: 10_000})
	resp := post(t, context.Background(), url+"/v1/chat/completions", chatBody(400, 1_000_000))
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	require.True(t, sc.Scan()) // a first token
	s.Close()
	for sc.Scan() {
		assert.NotEqual(t, "data: [DONE]", sc.Text(), "a cut answer does not end as a whole one")
	}
	s.Close() // again: nothing more
}

func TestGPUConfigCheck(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  GPUConfig
		ok   bool
	}{
		{"defaults", GPUConfig{KVTokens: 1000}, true},
		{"no model", GPUConfig{}, true},
		{"negative cache", GPUConfig{KVTokens: -1}, false},
		{"negative max_num_seqs", GPUConfig{KVTokens: 1000, MaxNumSeqs: -1}, false},
		{"negative step", GPUConfig{KVTokens: 1000, StepBase: -time.Millisecond}, false},
		{"negative sigma", GPUConfig{KVTokens: 1000, AnswerSigma: -1}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := tc.cfg.Check(); tc.ok {
				assert.NoError(t, err)
			} else {
				assert.Error(t, err)
			}
		})
	}
	assert.Panics(t, func() { New(Config{GPU: GPUConfig{KVTokens: 10, MaxBatchedTokens: -5}}) })
}
