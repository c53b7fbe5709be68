package caddyfairqueue

import (
	"context"
	"net/http"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestOllamaModelWithoutATagIsItsLatestTag: Ollama reads a model named
// without a tag ("llama3") as its "latest" tag, so on Ollama's native API
// {http.fair_queue.model} is the name with ":latest" added: a queue per
// model is one queue for both spellings (not two, each with the model's
// permits), and names lists the names `ollama list` shows. An
// OpenAI-compatible path keeps the name as sent.
func TestOllamaModelWithoutATagIsItsLatestTag(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	h := provisionLocal(t, newContext(t), &Handler{
		Name: "{http.fair_queue.model}", Names: []string{"llama3:latest", "qwen2.5:7b", "gpt-4o"}, Permits: 1,
	})
	for _, tc := range []struct{ path, model, queue string }{
		{"/api/chat", "llama3", "llama3:latest"},
		{"/api/generate", "llama3:latest", "llama3:latest"},
		{"/ollama/api/embed", "llama3", "llama3:latest"},
		{"/api/chat", "qwen2.5:7b", "qwen2.5:7b"},
		{"/v1/chat/completions", "gpt-4o", "gpt-4o"},
	} {
		req := newRequest(context.Background(), `{"model":"`+tc.model+`","stream":false}`)
		req.r.URL.Path = tc.path
		req.start(h, okHandler).wait(t)
		require.Equal(t, http.StatusOK, req.w.Code, "%s %s: %s", tc.path, tc.model, req.w.Body.String())
		assert.Equal(t, tc.queue, req.placeholder(phQueue), "%s %s", tc.path, tc.model)
		assert.Equal(t, tc.queue, req.placeholder(phModel), "%s %s", tc.path, tc.model)
	}
}

func TestOllamaModelNameTakesATagOnlyWhereItHasNone(t *testing.T) {
	for in, want := range map[string]string{
		"llama3":                               "llama3:latest",
		"llama3:8b":                            "llama3:8b",
		"library/llama3":                       "library/llama3:latest",
		"registry.example:5000/team/llama3":    "registry.example:5000/team/llama3:latest",
		"registry.example:5000/team/llama3:q4": "registry.example:5000/team/llama3:q4",
		"llama3@sha256:0123456789abcdef":       "llama3@sha256:0123456789abcdef",
		"":                                     "",
	} {
		assert.Equal(t, want, ollamaModel(in), in)
	}
}

// TestOllamaModelNamesListedWithoutATagStillServeIt: names that list a
// model without its tag ("llama3", as written before the native API's
// names took ":latest") serve both spellings on Ollama's native API, in
// the listed name's one queue; an OpenAI-compatible path takes the name
// as sent.
func TestOllamaModelNamesListedWithoutATagStillServeIt(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	h := provisionLocal(t, newContext(t), &Handler{
		Name: "ollama-{http.fair_queue.model}", Names: []string{"ollama-llama3", "ollama-qwen2.5:latest"}, Permits: 1,
	})
	for _, tc := range []struct {
		path, model string
		code        int
		queue       string
	}{
		{"/api/chat", "llama3", http.StatusOK, "ollama-llama3"},
		{"/api/generate", "llama3:latest", http.StatusOK, "ollama-llama3"},
		{"/api/chat", "qwen2.5", http.StatusOK, "ollama-qwen2.5:latest"},
		{"/api/chat", "qwen2.5:latest", http.StatusOK, "ollama-qwen2.5:latest"},
		{"/api/chat", "llama3:8b", http.StatusNotFound, ""},
		{"/v1/chat/completions", "llama3:latest", http.StatusNotFound, ""},
	} {
		req := newRequest(context.Background(), `{"model":"`+tc.model+`","stream":false}`)
		req.r.URL.Path = tc.path
		req.start(h, okHandler).wait(t)
		require.Equal(t, tc.code, req.w.Code, "%s %s: %s", tc.path, tc.model, req.w.Body.String())
		if tc.code == http.StatusOK {
			assert.Equal(t, tc.queue, req.placeholder(phQueue), "%s %s", tc.path, tc.model)
		}
	}
}

func TestOllamaUntagged(t *testing.T) {
	for in, want := range map[string]string{
		"llama3":                         "llama3",
		"llama3:latest":                  "llama3",
		"team/llama3:latest":             "team/llama3",
		"host:5000/team/llama3:latest":   "host:5000/team/llama3",
		"host:5000/team/llama3":          "host:5000/team/llama3",
		"llama3:8b":                      "",
		"llama3@sha256:0123456789abcdef": "",
		":latest":                        "",
		"":                               "",
	} {
		got, ok := ollamaUntagged(in)
		assert.Equal(t, want, got, in)
		assert.Equal(t, want != "", ok, in)
	}
}
