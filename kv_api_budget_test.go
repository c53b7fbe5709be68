package caddyfairqueue

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
)

// Ollama's native API (/api/chat, /api/generate) reads the completion
// budget from "options": {"num_predict"} alone, and knows no top-level
// "max_tokens"; an OpenAI-compatible one (vLLM, SGLang, Ollama's /v1)
// reads "max_tokens" and the like, and knows no "options". The budget
// is the one the request's API reads: a client cannot be weighed by a
// key that its backend ignores.
func TestBudgetIsTheOneTheRequestsAPIReads(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	h := provisionLocal(t, newContext(t), &Handler{Name: "kv-api-budget", KVTokens: 100000, DefaultMaxTokens: 500})
	msgs := `"messages":[{"role":"user","content":"abcd"}]`
	for _, tc := range []struct {
		name, path, body string
		want             int64
	}{
		{"OpenAI: max_tokens", "/v1/chat/completions", `{"model":"m","max_tokens":30,` + msgs + `}`, 1 + 30},
		{"OpenAI ignores num_predict", "/v1/chat/completions", `{"model":"m","options":{"num_predict":1},` + msgs + `}`, 1 + 500},
		{"OpenAI: max_tokens, num_predict ignored", "/v1/chat/completions", `{"model":"m","max_tokens":30,"options":{"num_predict":9000},` + msgs + `}`, 1 + 30},
		{"Ollama chat: num_predict", "/api/chat", `{"model":"m","options":{"num_predict":40},` + msgs + `}`, 1 + 40},
		{"Ollama chat ignores max_tokens", "/api/chat", `{"model":"m","max_tokens":1,"options":{"num_predict":4000},` + msgs + `}`, 1 + 4000},
		{"Ollama generate ignores max_tokens", "/api/generate", `{"model":"m","max_tokens":1,"prompt":"abcd"}`, 1 + 500},
	} {
		t.Run(tc.name, func(t *testing.T) {
			next := newHolder()
			req := newRequest(context.Background(), tc.body)
			req.r.URL.Path = tc.path
			req.start(h, next)
			next.waitEntered(t)
			assert.Equal(t, tc.want, h.engineList()[0].tokens.Load())
			next.release <- struct{}{}
			req.wait(t)
			settled(t, h)
		})
	}
}
