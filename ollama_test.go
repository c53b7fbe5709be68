package caddyfairqueue

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/internal/mockllm"
)

// postPath sends body to path of srv; it returns once the header is in.
func (s *served) postPath(t *testing.T, path, body string) *http.Response {
	t.Helper()
	req, err := http.NewRequestWithContext(context.Background(), http.MethodPost, s.url+path, strings.NewReader(body))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	t.Cleanup(func() { resp.Body.Close() })
	return resp
}

// ndjson reads every line of an NDJSON body, each a JSON object.
func ndjson(t *testing.T, body io.Reader) []map[string]any {
	t.Helper()
	var out []map[string]any
	sc := bufio.NewScanner(body)
	for sc.Scan() {
		var v map[string]any
		require.NoError(t, json.Unmarshal(sc.Bytes(), &v), "line %q is not one JSON object", sc.Text())
		out = append(out, v)
	}
	return out
}

func ollamaUpstream(t *testing.T) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(mockllm.New(mockllm.Config{Tokens: 2, Delay: time.Millisecond}).Handler())
	t.Cleanup(srv.Close)
	return srv
}

func TestAPIOfReadsOllamaPathsBehindAPrefix(t *testing.T) {
	for path, want := range map[string]api{
		"/api/chat": apiOllamaChat, "/ollama/api/generate": apiOllamaGenerate, "/api/embed": apiOllamaEmbed,
		"/api/embeddings/": apiOllamaEmbed, "/v1/chat/completions": apiOpenAI, "/api/chats": apiOpenAI, "/": apiOpenAI,
	} {
		assert.Equal(t, want, apiOf(httptest.NewRequest(http.MethodPost, path, nil)), path)
	}
}

// TestOllamaStreamWaitsWithEmptyChunksThenRelaysTheAnswer: Ollama's
// /api/chat streams unless "stream": false, so a request without it
// waits as a stream: sse_keepalive sends it NDJSON chunks with no text
// (an NDJSON stream has no comments), then the upstream's lines.
func TestOllamaStreamWaitsWithEmptyChunksThenRelaysTheAnswer(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	h := keepaliveHandler(t, "ollama-stream", &Handler{SSEQueueEvents: true})
	srv := serve(t, h, proxyTo(t, ollamaUpstream(t).Config.Handler))
	release := holdPermit(t, h)
	go func() {
		time.Sleep(350 * time.Millisecond)
		release()
	}()

	resp := srv.postPath(t, "/api/chat", `{"model":"llama3","messages":[{"role":"user","content":"hi"}]}`)
	assert.Equal(t, http.StatusOK, resp.StatusCode)
	assert.Equal(t, "application/x-ndjson", resp.Header.Get("Content-Type"))
	lines := ndjson(t, resp.Body)
	require.GreaterOrEqual(t, len(lines), 4, "waiting chunks, two tokens and the last line")
	assert.Equal(t, map[string]any{"role": "assistant", "content": ""}, lines[0]["message"], "a chunk with no text while waiting")
	assert.Equal(t, "llama3", lines[0]["model"])
	assert.Equal(t, false, lines[0]["done"])
	text := ""
	for _, l := range lines {
		text += l["message"].(map[string]any)["content"].(string)
	}
	assert.Equal(t, "tok tok ", text, "what the client reads: the upstream's answer alone")
	assert.Equal(t, true, lines[len(lines)-1]["done"])
	assert.Equal(t, "granted", srv.outcome(t))
}

func TestOllamaRejectsInOllamaShape(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	h := provisionLocal(t, newContext(t), &Handler{Name: "ollama-reject", Permits: 1, MaxWait: caddy.Duration(200 * time.Millisecond)})
	srv := serve(t, h, proxyTo(t, ollamaUpstream(t).Config.Handler))
	holdPermit(t, h)
	for _, body := range []string{`{"model":"m","prompt":"hi"}`, `{"model":"m","prompt":"hi","stream":false}`} {
		resp := srv.postPath(t, "/api/generate", body)
		assert.Equal(t, http.StatusTooManyRequests, resp.StatusCode, "%s: the JSON status, streaming or not", body)
		assert.Equal(t, "application/json", resp.Header.Get("Content-Type"))
		assert.NotEmpty(t, resp.Header.Get("Retry-After"))
		var e map[string]any
		require.NoError(t, json.NewDecoder(resp.Body).Decode(&e))
		msg, _ := e["error"].(string)
		assert.Contains(t, msg, "The server is busy", "Ollama's error: a string")
		assert.Equal(t, "timeout", srv.outcome(t))
	}
}

func TestOllamaRejectOnACommittedStreamIsAnErrorLine(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	h := keepaliveHandler(t, "ollama-committed", &Handler{MaxWait: caddy.Duration(450 * time.Millisecond)})
	srv := serve(t, h, proxyTo(t, ollamaUpstream(t).Config.Handler))
	holdPermit(t, h)
	resp := srv.postPath(t, "/api/chat", `{"model":"m","messages":[]}`)
	assert.Equal(t, http.StatusOK, resp.StatusCode)
	lines := ndjson(t, resp.Body)
	require.NotEmpty(t, lines)
	last := lines[len(lines)-1]
	assert.Contains(t, last["error"], "The server is busy", "Ollama's clients throw on a line with an error")
	assert.Equal(t, "timeout", srv.outcome(t))
}

func TestUsageWriterReadsOllamasCounts(t *testing.T) {
	// /api/generate's last line holds the context, a token array, before
	// its counts: longer than any line read whole.
	context := strings.Repeat("128009,", 20000)
	long := `{"done":true,"context":[` + context + `1],"total_duration":5,"prompt_eval_count":26,"prompt_eval_duration":3,"eval_count":290}` + "\n"
	for _, tc := range []struct {
		name, ctype, body string
		want              float64
	}{
		{"stream", "application/x-ndjson", `{"message":{"content":"a"},"done":false}` + "\n" + `{"done":true,"prompt_eval_count":26,"eval_count":290}` + "\n", 316},
		{"whole answer", "application/json", `{"response":"a","done":true,"prompt_eval_count":26,"eval_count":290}`, 316},
		{"embedding", "application/json", `{"model":"m","embeddings":[[0.1]],"prompt_eval_count":8}`, 8},
		{"a last line with the context", "application/x-ndjson", `{"response":"a","done":false}` + "\n" + long, 316},
	} {
		rec := httptest.NewRecorder()
		u := newUsageWriter(rec)
		u.Header().Set("Content-Type", tc.ctype)
		for b := []byte(tc.body); len(b) > 0; { // as a proxy writes: in pieces
			n := min(len(b), 3000)
			_, _ = u.Write(b[:n])
			b = b[n:]
		}
		total, ok := u.totalTokens()
		assert.True(t, ok, tc.name)
		assert.Equal(t, tc.want, total, tc.name)
		assert.Equal(t, tc.body, rec.Body.String(), "%s: passed on unchanged", tc.name)
	}
}

// TestOllamaConfiguredRejectBodyIsTheErrorLineOfACommittedStream: a
// reject body the operator wrote is what Ollama's clients get, whichever
// way the request waited: on a stream the keepalive committed, as one
// NDJSON line (a template over several lines is put on one).
func TestOllamaConfiguredRejectBodyIsTheErrorLineOfACommittedStream(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	h := keepaliveHandler(t, "ollama-own-reject", &Handler{MaxWait: caddy.Duration(450 * time.Millisecond),
		Reject: []*RejectConfig{{RetryAfter: "3s", Body: "{\n\t\"error\": \"GPUs busy ({http.fair_queue.reason}), retry in {http.fair_queue.retry_after}s\"\n}"}}})
	srv := serve(t, h, proxyTo(t, ollamaUpstream(t).Config.Handler))
	holdPermit(t, h)
	resp := srv.postPath(t, "/api/chat", `{"model":"m","messages":[]}`)
	assert.Equal(t, http.StatusOK, resp.StatusCode)
	lines := ndjson(t, resp.Body)
	require.NotEmpty(t, lines)
	assert.Equal(t, map[string]any{"error": "GPUs busy (timeout), retry in 3s"}, lines[len(lines)-1])
	for _, l := range lines[:len(lines)-1] {
		assert.Equal(t, false, l["done"], "the waiting chunks before it")
	}
	assert.Equal(t, "timeout", srv.outcome(t))
}

// TestOllamaNumPredictIsItsMaxTokensCost: Ollama's native API sets its
// completion limit in options.num_predict (its OpenAI-compatible API maps
// max_tokens there), so cost max_tokens charges a native request that,
// as it charges an OpenAI request its max_tokens; -1 and -2 (no limit)
// set none, and a max_tokens, which the native API ignores, is none.
func TestOllamaNumPredictIsItsMaxTokensCost(t *testing.T) {
	h := fairHandler(t, &Handler{Tenant: "{http.request.header.X-Tenant}", Cost: CostMaxTokens, MaxCost: 1000})
	for body, want := range map[string]float64{
		`{"model":"llama3","messages":[],"options":{"num_predict":256}}`:  256,
		`{"model":"llama3","prompt":"hi","options":{"num_predict":5000}}`: 1000,
		`{"model":"llama3","prompt":"hi","options":{"num_predict":-1}}`:   1,
		`{"model":"llama3","prompt":"hi","options":{"temperature":0}}`:    1,
		`{"model":"llama3","prompt":"hi","max_tokens":300}`:               1, // Ollama reads no max_tokens
	} {
		req := newRequest(context.Background(), body)
		got := h.fairRequest(req.repl, apiOllamaGenerate.sniff([]byte(body)))
		assert.Equal(t, want, got.Cost, body)
	}
}
