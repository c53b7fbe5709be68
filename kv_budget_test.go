package caddyfairqueue

import (
	"context"
	"io"
	"math"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/internal/mockllm"
)

func TestBudgetEstimatorLearnsTheQuantileOfTheLastAnswers(t *testing.T) {
	var e budgetEstimator
	for i := range budgetMinSamples - 1 {
		e.observe(float64(i + 1))
	}
	assert.Equal(t, int64(1024), e.get(1024), "too few answers: the default")
	budget, n := e.state()
	assert.Zero(t, budget)
	assert.Equal(t, int64(budgetMinSamples-1), n)

	e.observe(budgetMinSamples) // answers of 1 to 20 tokens
	assert.Equal(t, int64(19), e.get(1024), "the 95th percentile of 1..20")
	for _, bad := range []float64{-1, math.NaN(), math.Inf(1)} {
		e.observe(bad)
	}
	_, n = e.state()
	assert.Equal(t, int64(budgetMinSamples), n, "no count is not learned")

	// The window rolls: 256 answers of 5 tokens later, the first ones are
	// below the quantile.
	for range budgetWindow {
		e.observe(5)
	}
	assert.Equal(t, int64(5), e.get(1024))

	// One long answer in twenty leaves the budget; two move it.
	var f budgetEstimator
	for range budgetMinSamples - 1 {
		f.observe(10)
	}
	f.observe(1000)
	assert.Equal(t, int64(10), f.get(1024))
	for range 2*budgetEvery - 5 {
		f.observe(10)
	}
	f.observe(2000) // the 32nd answer: computed again
	assert.Equal(t, int64(1000), f.get(1024), "2 of 32 answers above: the quantile is the lower of them")

	var g budgetEstimator
	for range budgetMinSamples {
		g.observe(0)
	}
	assert.Equal(t, int64(1), g.get(1024), "at least 1")
}

func TestUsageWriterReadsTheCompletionTokens(t *testing.T) {
	for _, tc := range []struct {
		name, contentType, body string
		want                    float64
		found                   bool
	}{
		{"OpenAI JSON", "application/json", `{"usage":{"prompt_tokens":10,"completion_tokens":25,"total_tokens":35}}`, 25, true},
		{"OpenAI stream", "text/event-stream", "data: {\"choices\":[]}\n\ndata: {\"usage\":{\"prompt_tokens\":4,\"total_tokens\":9}}\n\ndata: [DONE]\n\n", 5, true},
		{"Responses API", "application/json", `{"response":{"usage":{"input_tokens":3,"output_tokens":8,"total_tokens":11}}}`, 8, true},
		{"Ollama NDJSON", "application/x-ndjson", "{\"done\":false}\n{\"done\":true,\"prompt_eval_count\":7,\"eval_count\":12}\n", 12, true},
		{"no prompt count", "application/json", `{"usage":{"total_tokens":35}}`, 0, false},
		{"no usage", "application/json", `{"choices":[]}`, 0, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, found := answered(t, tc.contentType, tc.body).completionTokens()
			assert.Equal(t, tc.found, found)
			assert.Equal(t, tc.want, got)
		})
	}
}

// A queue learns the completion budget of the requests that set none
// from their answers, weighs the next such request with it, and shows
// it; requests that set a budget teach it nothing, and a handler that
// fixes default_max_tokens learns none.
func TestQueueLearnsTheCompletionBudgetOfRequestsThatSetNone(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	const generated = 7
	h := provisionLocal(t, newContext(t), &Handler{Name: "kv-budget", KVTokens: 100000})
	mock := mockllm.New(mockllm.Config{Tokens: generated, Delay: -1})
	srv := serve(t, h, proxyTo(t, mock.Handler()))
	text := strings.Repeat("a", 400)
	open := `{"model":"m","messages":[{"role":"user","content":"` + text + `"}]}`
	send := func(body string) {
		t.Helper()
		resp := srv.post(t, context.Background(), body)
		_, _ = io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		require.Equal(t, outcomeGranted, srv.outcome(t))
		settled(t, h)
	}
	for range budgetMinSamples {
		send(open)
	}
	send(`{"model":"m","max_tokens":3,"messages":[]}`) // sets its own: not learned
	e := h.engineList()[0]
	budget, n := e.budget.state()
	assert.Equal(t, int64(generated), budget)
	assert.Equal(t, int64(budgetMinSamples), n)

	st := queueStatus(context.Background())
	require.Len(t, st.Queues, 1)
	require.NotNil(t, st.Queues[0].KV)
	assert.Equal(t, int64(generated), st.Queues[0].KV.CompletionBudget)
	assert.Equal(t, int64(budgetMinSamples), st.Queues[0].KV.CompletionSamples)

	// The next request that sets none weighs its prompt and the learned
	// budget, not 1024.
	slow := mockllm.New(mockllm.Config{Tokens: 1, Delay: time.Hour})
	srv = serve(t, h, proxyTo(t, slow.Handler()))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, srv.url+"/v1/chat/completions", strings.NewReader(open))
		if resp, err := http.DefaultClient.Do(req); err == nil {
			_, _ = io.ReadAll(resp.Body)
			_ = resp.Body.Close()
		}
	}()
	require.Eventually(t, func() bool { return e.tokens.Load() > 0 }, 5*time.Second, time.Millisecond)
	prompt := int64(math.Ceil(float64(len(text)) / e.kv.bytesPerToken()))
	assert.Equal(t, prompt+generated, e.tokens.Load())
	cancel()
	settled(t, h)

	// Fixed: nothing is learned.
	fixed := provisionLocal(t, newContext(t), &Handler{Name: "kv-fixed", KVTokens: 100000, DefaultMaxTokens: 300})
	srv = serve(t, fixed, proxyTo(t, mock.Handler()))
	resp := srv.post(t, context.Background(), open)
	_, _ = io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	require.Equal(t, outcomeGranted, srv.outcome(t))
	settled(t, fixed)
	for _, e := range fixed.engineList() {
		_, n := e.budget.state()
		assert.Zero(t, n, "default_max_tokens set: no budget learned")
	}
}
