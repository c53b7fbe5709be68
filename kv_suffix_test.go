package caddyfairqueue

import (
	"context"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
)

// A fill-in-the-middle request (Ollama's /api/generate, a completions
// API) sends the text after the cursor as "suffix", often the rest of a
// file, and Ollama's "template" replaces the model's prompt template:
// the backend puts both into the prompt it evaluates. The weight counts
// them as the prompt's text.
func TestWeightCountsASuffixAndATemplate(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	h := provisionLocal(t, newContext(t), &Handler{Name: "kv-suffix", KVTokens: 100000})
	after := strings.Repeat("s", 4000)
	for _, tc := range []struct {
		name, path, body string
		want             int64
	}{
		{"Ollama generate suffix", "/api/generate", `{"model":"m","prompt":"abcd","suffix":"` + after + `","options":{"num_predict":10}}`, 1 + 1000 + 10},
		{"Ollama generate template", "/api/generate", `{"model":"m","prompt":"abcd","template":"` + after + `{{ .Prompt }}","options":{"num_predict":10}}`, (4+4000+13+3)/4 + 10},
		{"completions suffix", "/v1/completions", `{"model":"m","prompt":"abcd","suffix":"` + after + `","max_tokens":10}`, 1 + 1000 + 10},
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
