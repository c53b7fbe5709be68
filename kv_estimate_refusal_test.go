package caddyfairqueue

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A conversation in which the assistant once refused holds a refusal
// part ({"type":"refusal","refusal":"..."}: the Chat Completions API's
// assistant content part, and the Responses API's output item a client
// passes back in its input): text the chat template renders, not an
// image. Its answers teach the prompt estimate as any text prompt's do,
// and the refusal's text is weighed with the rest.
func TestPromptsWithARefusalPartTeachThePromptEstimate(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	question := strings.Repeat("ab", 500)
	refusal := strings.Repeat("no", 250)
	// The backend's tokenizer: 2 bytes of this text a token.
	promptTokens := (2*len(question) + len(refusal)) / 2
	upstream := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		_, _ = fmt.Fprintf(w, `{"choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}],"usage":{"prompt_tokens":%d,"input_tokens":%d,"completion_tokens":1,"total_tokens":%d}}`,
			promptTokens, promptTokens, promptTokens+1)
	})
	for _, tc := range []struct{ name, path, body string }{
		{"chat", "/v1/chat/completions", `{"model":"m","max_tokens":1,"messages":[` +
			`{"role":"user","content":"` + question + `"},` +
			`{"role":"assistant","content":[{"type":"refusal","refusal":"` + refusal + `"}]},` +
			`{"role":"user","content":[{"type":"text","text":"` + question + `"}]}]}`},
		{"responses", "/v1/responses", `{"model":"m","max_output_tokens":1,"input":[` +
			`{"role":"user","content":"` + question + `"},` +
			`{"type":"message","role":"assistant","content":[{"type":"refusal","refusal":"` + refusal + `"}]},` +
			`{"role":"user","content":[{"type":"input_text","text":"` + question + `"}]}]}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := provisionLocal(t, newContext(t), &Handler{Name: "kv-refusal-" + tc.name, KVTokens: 1 << 20, DefaultMaxTokens: 1})
			srv := serve(t, h, proxyTo(t, upstream))
			for range 100 {
				resp := srv.postPath(t, tc.path, tc.body)
				_, _ = io.ReadAll(resp.Body)
				_ = resp.Body.Close()
				require.Equal(t, http.StatusOK, resp.StatusCode)
				require.Equal(t, outcomeGranted, srv.outcome(t))
				settled(t, h)
			}
			e := h.engineList()[0]
			ratio, n := e.kv.state()
			t.Logf("bytes per token %.2f from %d answers", ratio, n)
			assert.Equal(t, int64(100), n, "a prompt with a refusal part is text: its answers are learned")
			assert.InDelta(t, 2, ratio, 0.25, "the ratio comes to the backend's, the refusal's text counted")
		})
	}
}
