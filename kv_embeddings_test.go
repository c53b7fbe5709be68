package caddyfairqueue

import (
	"context"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
)

// An embeddings request generates no token, whatever its body says: its
// budget is 0 (docs/reference.md, default_max_tokens: "an embeddings
// request ... has a budget of 0"), so a max_tokens or num_predict it
// carries (which the backend ignores there) holds no KV-cache room.
func TestAnEmbeddingsRequestWeighsItsInputAloneWhateverBudgetItSets(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	h := provisionLocal(t, newContext(t), &Handler{Name: "kv-embeddings", KVTokens: 100000})
	input := strings.Repeat("x", 40) // 10 tokens at 4 bytes per token
	for _, tc := range []struct {
		name, path, body string
	}{
		{"OpenAI max_tokens", "/v1/embeddings", `{"model":"e","max_tokens":500,"input":"` + input + `"}`},
		{"OpenAI n and max_completion_tokens", "/v1/embeddings", `{"model":"e","n":4,"max_completion_tokens":500,"input":"` + input + `"}`},
		{"Ollama embed num_predict", "/api/embed", `{"model":"e","input":"` + input + `","options":{"num_predict":500}}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			next := newHolder()
			req := newRequest(context.Background(), tc.body)
			req.r.URL.Path = tc.path
			req.start(h, next)
			next.waitEntered(t)
			assert.Equal(t, int64(10), h.engineList()[0].tokens.Load(), "the input's tokens alone")
			next.release <- struct{}{}
			req.wait(t)
			settled(t, h)
		})
	}
}
