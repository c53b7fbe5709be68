package caddyfairqueue

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// An OpenAI-compatible backend (vLLM, SGLang) generates n completions
// for a request with "n": n, and one per prompt of a completions batch
// ("prompt": [...]), each up to the budget, each holding its own tokens
// in the KV cache (the prompt's are shared, or its own per prompt). The
// weight counts every one, not one.
func TestWeightCountsEveryCompletionTheBackendGenerates(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	h := provisionLocal(t, newContext(t), &Handler{Name: "kv-choices", KVTokens: 100000})
	e := func() *engine { return h.engineList()[0] }
	chat := `{"model":"m","max_tokens":100,%s"messages":[{"role":"user","content":"` + strings.Repeat("a", 40) + `"}]}`
	batch := `{"model":"m","max_tokens":100,%s"prompt":["` + strings.Repeat("a", 40) + `","` + strings.Repeat("b", 40) + `","` + strings.Repeat("c", 40) + `"]}`
	for _, tc := range []struct {
		name, body string
		want       int64
	}{
		{"one completion", fmt.Sprintf(chat, ""), 10 + 100},
		{"n", fmt.Sprintf(chat, `"n":8,`), 10 + 8*100},
		{"n as a string, as pydantic takes it", fmt.Sprintf(chat, `"n":"8",`), 10 + 8*100},
		{"best_of above n", fmt.Sprintf(chat, `"n":2,"best_of":5,`), 10 + 5*100},
		{"a batch of prompts", fmt.Sprintf(batch, ""), 30 + 3*100},
		{"a batch of prompts, n each", fmt.Sprintf(batch, `"n":2,`), 30 + 6*100},
	} {
		t.Run(tc.name, func(t *testing.T) {
			next := newHolder()
			req := newRequest(context.Background(), tc.body).start(h, next)
			next.waitEntered(t)
			assert.Equal(t, tc.want, e().tokens.Load())
			next.release <- struct{}{}
			req.wait(t)
			settled(t, h)
		})
	}
}

// The budget a queue learns is one completion's: an answer of n
// completions teaches its usage's completion tokens divided by n.
func TestLearnedBudgetIsPerCompletion(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	const n, each = 4, 7
	h := provisionLocal(t, newContext(t), &Handler{Name: "kv-choices-learn", KVTokens: 100000})
	upstream := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		_, _ = fmt.Fprintf(w, `{"choices":[],"usage":{"prompt_tokens":10,"completion_tokens":%d,"total_tokens":%d}}`, n*each, 10+n*each)
	})
	srv := serve(t, h, proxyTo(t, upstream))
	body := fmt.Sprintf(`{"model":"m","n":%d,"messages":[{"role":"user","content":"hi"}]}`, n)
	for range budgetMinSamples {
		resp := srv.post(t, context.Background(), body)
		_, _ = io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		require.Equal(t, outcomeGranted, srv.outcome(t))
		settled(t, h)
	}
	budget, samples := h.engineList()[0].budget.state()
	assert.Equal(t, int64(budgetMinSamples), samples)
	assert.Equal(t, int64(each), budget, "one completion's tokens")
}
