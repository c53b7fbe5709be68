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
)

// vLLM's and SGLang's pooling endpoints (/v1/score, /v1/rerank,
// /classify, /pooling) generate no tokens, as embeddings do: their
// answer's usage counts the input alone (total_tokens = prompt_tokens).
// A queue that learns its completion budget learns nothing from them,
// and such a request is weighed without a completion budget. Before,
// each answer taught the learned budget 0 generated tokens, so that a
// client posting them pulled the budget of every chat request of its
// queue down to 1 token (admitted far lighter than it runs), and each
// was weighed with a completion budget it never generates.
func TestPoolingEndpointsTeachAndReserveNoCompletionBudget(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	release := make(chan struct{})
	upstream := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		if r.URL.Query().Has("hold") {
			<-release
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"id":"x","object":"list","data":[{"index":0,"score":0.5}],`+
			`"usage":{"prompt_tokens":12,"total_tokens":12,"completion_tokens":0}}`)
	})
	h := provisionLocal(t, newContext(t), &Handler{Name: "kv-pooling", KVTokens: 100000})
	srv := serve(t, h, proxyTo(t, upstream))
	body := `{"model":"m","text_1":"what is fair","text_2":["a queue","a lottery"]}`
	post := func(ctx context.Context, path string) {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, srv.url+path, strings.NewReader(body))
		require.NoError(t, err)
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return // the context ended
		}
		_, _ = io.ReadAll(resp.Body)
		_ = resp.Body.Close()
	}
	for _, path := range []string{"/v1/score", "/v1/rerank", "/classify", "/pooling", "/rerank"} {
		for range budgetMinSamples {
			post(context.Background(), path)
			require.Equal(t, outcomeGranted, srv.outcome(t))
			settled(t, h)
		}
	}
	e := h.engineList()[0]
	budget, n := e.budget.state()
	assert.Zero(t, n, "no completion budget learned from pooling answers (learned %d)", budget)

	// A pooling request held at the upstream weighs its body alone,
	// whatever max_tokens it sends.
	body = `{"model":"m","max_tokens":5000,"query":"what is fair","documents":["a queue","a lottery"]}`
	done := make(chan struct{})
	go func() { defer close(done); post(context.Background(), "/v1/rerank?hold=1") }()
	require.Eventually(t, func() bool { return e.tokens.Load() > 0 }, 10*time.Second, time.Millisecond)
	assert.Equal(t, int64(math.Ceil(float64(len(body))/e.kv.bytesPerToken())), e.tokens.Load(),
		"the body's tokens, no completion budget")
	close(release)
	<-done
	require.Equal(t, outcomeGranted, srv.outcome(t))
	settled(t, h)
}
