package caddyfairqueue

import (
	"context"
	"encoding/json"
	"net/http"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// With a queue per model (name {http.fair_queue.model}) and names, a
// request that names no model (a JSON body without "model", a body that
// is not JSON, no body) is a malformed request, not one for a model
// served elsewhere: it is answered 400 with code model_missing, saying
// what is missing, in the API's error shape (OpenAI's JSON object,
// Ollama's {"error":...} on its native paths, JSON for a stream request
// too, as every 4xx the handler answers), at once, opening no queue. A
// model not listed is still 404 model_not_found.
func TestARequestNamingNoModelIsAnswered400UnderNames(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	h := provisionLocal(t, newContext(t), &Handler{Name: "{http.fair_queue.model}", Names: []string{"served"}, Permits: 1})
	for _, tc := range []struct {
		name, path, body, accept, says string
	}{
		{"no model", "/v1/chat/completions", `{"messages":[{"role":"user","content":"hi"}]}`, "", `has no "model"`},
		{"model not a string", "/v1/chat/completions", `{"model":5,"messages":[]}`, "", `has no "model"`},
		{"not JSON", "/v1/chat/completions", `model=served`, "", "not a JSON object"},
		{"no body", "/v1/chat/completions", ``, "", "has no body"},
		{"a stream without model", "/v1/chat/completions", `{"stream":true,"messages":[]}`, "text/event-stream", `has no "model"`},
		{"Ollama without model", "/api/chat", `{"messages":[]}`, "", `has no "model"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req := newRequest(context.Background(), tc.body)
			req.r.URL.Path = tc.path
			if tc.accept != "" {
				req.r.Header.Set("Accept", tc.accept)
			}
			req.start(h, okHandler).wait(t)
			assert.Equal(t, http.StatusBadRequest, req.w.Code, req.w.Body.String())
			assert.Equal(t, "application/json", req.w.Header().Get("Content-Type"))
			assert.Equal(t, "model_missing", req.placeholder(phOutcome))
			if tc.path == "/api/chat" {
				var answer struct{ Error string }
				require.NoError(t, json.Unmarshal(req.w.Body.Bytes(), &answer), req.w.Body.String())
				assert.Contains(t, answer.Error, "names no model")
				assert.Contains(t, answer.Error, tc.says)
				return
			}
			var answer apiError
			require.NoError(t, json.Unmarshal(req.w.Body.Bytes(), &answer), req.w.Body.String())
			assert.Equal(t, "model_missing", answer.Error.Code)
			assert.Equal(t, "invalid_request_error", answer.Error.Type)
			assert.Contains(t, answer.Error.Message, "names no model")
			assert.Contains(t, answer.Error.Message, tc.says)
		})
	}
	req := newRequest(context.Background(), `{"model":"madeup"}`).start(h, okHandler).wait(t)
	assert.Equal(t, http.StatusNotFound, req.w.Code, "a model not served")
	assert.Equal(t, outcomeUnknownName, req.placeholder(phOutcome))
	assert.Empty(t, h.engineList(), "a request without a model opened a queue")
}
