package caddyfairqueue

import (
	"context"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
)

// Ollama reads its native API's bodies with Go's encoding/json, which
// matches a key to a field case-insensitively, the last spelling
// winning ("OPTIONS" after "options" replaces it), and decodes a null
// into a string as nothing (the value before it stands) and into a map
// as none: the weight reads them so too, and a client cannot be weighed
// by a spelling or a null its backend overrides. An OpenAI-compatible
// body is read both ways, exact keys as vLLM's pydantic reads it and as
// Ollama's /v1 endpoints (Go) read it, the heavier counting
// (TestAnOpenAIBodyIsWeighedAsAGoBackendReadsItToo).
func TestOllamaKeysAreReadCaseInsensitively(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	h := provisionLocal(t, newContext(t), &Handler{Name: "kv-ollama-keys", KVTokens: 100000, DefaultMaxTokens: 500})
	long := strings.Repeat("s", 4000)
	for _, tc := range []struct {
		name, path, body string
		want             int64
	}{
		{"options spelled again", "/api/chat", `{"model":"m","messages":[{"role":"user","content":"abcd"}],"options":{"num_predict":1},"OPTIONS":{"num_predict":4000}}`, 1 + 4000},
		{"prompt spelled again", "/api/generate", `{"model":"m","prompt":"abcd","Prompt":"` + long + `","options":{"num_predict":10}}`, 1000 + 10},
		{"content spelled again", "/api/chat", `{"model":"m","messages":[{"role":"user","content":"abcd","Content":"` + long + `"}],"options":{"num_predict":10}}`, 1000 + 10},
		{"prompt sent again as null", "/api/generate", `{"model":"m","system":"","prompt":"` + long + `","PROMPT":null,"options":{"num_predict":10}}`, 1000 + 10},
		{"content sent again as null", "/api/chat", `{"model":"m","messages":[{"role":"user","content":"` + long + `","content":null}],"options":{"num_predict":10}}`, 1000 + 10},
		{"options sent again as null", "/api/chat", `{"model":"m","messages":[{"role":"user","content":"abcd"}],"options":{"num_predict":1},"options":null}`, 1 + 500},
		{"messages in capitals", "/api/chat", `{"model":"m","MESSAGES":[{"role":"user","content":"` + long + `"}],"options":{"num_predict":10}}`, 1000 + 10},
		{"OpenAI: the heavier reading", "/v1/chat/completions", `{"model":"m","max_tokens":100,"MAX_TOKENS":1,"messages":[{"role":"user","content":"abcd","CONTENT":"` + long + `"}]}`, 1000 + 100},
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
