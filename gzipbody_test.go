package caddyfairqueue

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A request body with a Content-Encoding (gzip) is handed on as it came,
// and not decoded: vLLM and SGLang (FastAPI, which decodes no request
// body) and Ollama (Go's net/http and gin) read its bytes as JSON and
// answer 400, so its model, stream and budget are read by no backend
// either. The queue's answer stays sane: with names and a queue per
// model, 400 model_missing at once, never reaching the backend; with a
// fixed queue it waits there, weighed by its encoded bytes and the
// default budget (never lighter than a body of its size with no
// budget), without keepalive unless its Accept header asks for an
// event stream, and gets the backend's 400, its bytes and header
// passed on unchanged.
func TestAGzipBodyIsHandedOnUnreadAndWeighedByItsBytes(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	var plain bytes.Buffer
	plain.WriteString(`{"model":"m","stream":true,"max_tokens":100000,"messages":[{"role":"user","content":"`)
	plain.WriteString(strings.Repeat("a long prompt ", 2000))
	plain.WriteString(`"}]}`)
	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	_, _ = zw.Write(plain.Bytes())
	require.NoError(t, zw.Close())

	type received struct {
		body     []byte
		encoding string
	}
	got := make(chan received, 1)
	hold := make(chan struct{})
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		got <- received{b, r.Header.Get("Content-Encoding")}
		<-hold
		var v map[string]any
		if json.Unmarshal(b, &v) != nil { // as vLLM, SGLang and Ollama read it
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusBadRequest)
			_, _ = io.WriteString(w, `{"error":{"message":"There was an error parsing the body","code":400}}`)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{}`)
	}))
	t.Cleanup(upstream.Close)
	port := freePort(t)
	config := fmt.Sprintf(`{"admin":{"disabled":true},"logging":{"logs":{"default":{"level":"ERROR"}}},
		"apps":{"http":{"servers":{"s":{"listen":["127.0.0.1:%d"],"routes":[
		{"match":[{"path":["/named/*"]}],"handle":[
		 {"handler":"fair_queue","name":"{http.fair_queue.model}","names":["m"],"permits":1},
		 {"handler":"reverse_proxy","upstreams":[{"dial":%[2]q}]}]},
		{"handle":[
		 {"handler":"fair_queue","name":"gzip-body","kv_tokens":1000000,"default_max_tokens":256},
		 {"handler":"reverse_proxy","upstreams":[{"dial":%[2]q}]}]}]}}}}}`,
		port, strings.TrimPrefix(upstream.URL, "http://"))
	require.NoError(t, caddy.Load([]byte(config), false))
	t.Cleanup(func() { _ = caddy.Stop() })
	post := func(path string) *http.Response {
		t.Helper()
		req, err := http.NewRequest(http.MethodPost, fmt.Sprintf("http://127.0.0.1:%d%s", port, path), bytes.NewReader(gz.Bytes()))
		require.NoError(t, err)
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Content-Encoding", "gzip")
		resp, err := http.DefaultTransport.RoundTrip(req)
		require.NoError(t, err)
		return resp
	}

	// With names: no model is read, and the request is refused at once.
	resp := post("/named/v1/chat/completions")
	b, _ := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	assert.Equal(t, http.StatusBadRequest, resp.StatusCode)
	assert.Equal(t, "application/json", resp.Header.Get("Content-Type"))
	assert.Contains(t, string(b), `"code":"model_missing"`)
	select {
	case r := <-got:
		t.Fatalf("the backend got it: %d bytes", len(r.body))
	default:
	}

	// A fixed queue: forwarded as it came, weighed by its bytes.
	done := make(chan *http.Response, 1)
	go func() { done <- post("/v1/chat/completions") }()
	var r received
	select {
	case r = <-got:
	case <-time.After(10 * time.Second):
		t.Fatal("the body never reached the backend")
	}
	assert.Equal(t, gz.Bytes(), r.body, "handed on as it came")
	assert.Equal(t, "gzip", r.encoding)
	q := queueRow(t, "gzip-body")
	require.NotNil(t, q.KV)
	assert.Equal(t, int64((gz.Len()+3)/4+256), q.KV.NodeTokensHeld,
		"its encoded bytes at 4 a token, and the default budget (not its unread max_tokens)")
	close(hold)
	select {
	case resp = <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("no answer")
	}
	b, _ = io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	assert.Equal(t, http.StatusBadRequest, resp.StatusCode, "the backend's answer: %s", b)
	assert.Equal(t, "application/json", resp.Header.Get("Content-Type"), "no stream: its body was not read")
	assert.JSONEq(t, `{"error":{"message":"There was an error parsing the body","code":400}}`, string(b))
}

// queueRow is queue name's row of the admin API.
func queueRow(t *testing.T, name string) queueReport {
	t.Helper()
	for _, q := range queueStatus(context.Background()).Queues {
		if q.Name == name {
			return q
		}
	}
	t.Fatalf("no queue %q", name)
	return queueReport{}
}
