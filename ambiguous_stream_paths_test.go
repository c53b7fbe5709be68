package caddyfairqueue

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A "stream" spelled in another letter case, or twice, is refused as
// ambiguous_stream only where a backend that reads keys in any case
// (Ollama's /v1, Go) reads "stream" at all: on /v1/embeddings no
// backend reads it (vLLM's, SGLang's and Ollama's embedding requests
// have no stream), and a native /generate is Python's (SGLang, vLLM's
// demo server: exact keys) or TGI's, which never streams; vLLM's
// /v1/rerank, /score, /pooling, /classify, /tokenize take no stream
// either. There the body is served as its backends read it. Before, it
// was refused with 400 ambiguous_stream, which no backend would have.
func TestAStreamInAnotherCaseIsServedWhereNoGoBackendReadsIt(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"path":"`+r.URL.Path+`"}`)
	}))
	t.Cleanup(upstream.Close)
	port := freePort(t)
	config := fmt.Sprintf(`{"admin":{"disabled":true},"logging":{"logs":{"default":{"level":"ERROR"}}},
		"apps":{"http":{"servers":{"s":{"listen":["127.0.0.1:%d"],"routes":[{"handle":[
		{"handler":"fair_queue","name":"ambiguous-stream-paths","permits":4,"max_wait":"10s"},
		{"handler":"reverse_proxy","upstreams":[{"dial":%q}]}]}]}}}}}`,
		port, strings.TrimPrefix(upstream.URL, "http://"))
	require.NoError(t, caddy.Load([]byte(config), false))
	t.Cleanup(func() { _ = caddy.Stop() })
	post := func(path, body string) (int, string) {
		t.Helper()
		resp, err := http.Post(fmt.Sprintf("http://127.0.0.1:%d%s", port, path), "application/json", strings.NewReader(body))
		require.NoError(t, err)
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	for _, tc := range []struct{ path, body string }{
		{"/v1/embeddings", `{"model":"m","input":"x","Stream":true}`},
		{"/v1/embeddings", `{"model":"m","input":"x","stream":false,"STREAM":true}`},
		{"/generate", `{"inputs":"x","Stream":true}`},
		{"/generate", `{"text":"x","stream":false,"STREAM":true}`},
		{"/generate_stream", `{"inputs":"x","Stream":true}`},
		{"/v1/rerank", `{"model":"m","query":"q","documents":["a"],"Stream":true}`},
		{"/score", `{"model":"m","text_1":"a","text_2":"b","stream":true,"STREAM":false}`},
		{"/tokenize", `{"model":"m","prompt":"x","Stream":true}`},
	} {
		t.Run(tc.path+" "+tc.body, func(t *testing.T) {
			status, body := post(tc.path, tc.body)
			assert.Equal(t, http.StatusOK, status, "%s", body)
			assert.JSONEq(t, `{"path":"`+tc.path+`"}`, body, "served by the upstream")
		})
	}
	// Where Ollama's /v1 reads it, it is still refused.
	status, body := post("/v1/chat/completions", `{"model":"m","messages":[],"Stream":true}`)
	assert.Equal(t, http.StatusBadRequest, status)
	assert.Contains(t, body, "ambiguous_stream")
}
