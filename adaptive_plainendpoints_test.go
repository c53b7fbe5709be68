package caddyfairqueue

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// adaptiveFront loads Caddy with an adaptive queue (target_ttft 1s)
// in front of upstream; it returns the URL of path on it.
func adaptiveFront(t *testing.T, name, extra string, upstream http.Handler) (url func(path string) string) {
	t.Helper()
	srv := httptest.NewServer(upstream)
	t.Cleanup(srv.Close)
	port := freePort(t)
	config := fmt.Sprintf(`{"admin":{"disabled":true},"logging":{"logs":{"default":{"level":"ERROR"}}},
		"apps":{"http":{"servers":{"s":{"listen":["127.0.0.1:%d"],"routes":[{"handle":[
		{"handler":"fair_queue","name":%q,"permits":8,"max_wait":"60s",
		 "adaptive":{"target_ttft":"1s","min_samples":2,%s"interval":"100ms","decrease":0.5,"step":0.25}},
		{"handler":"reverse_proxy","upstreams":[{"dial":%q}]}]}]}}}}}`,
		port, name, extra, strings.TrimPrefix(srv.URL, "http://"))
	require.NoError(t, caddy.Load([]byte(config), false))
	t.Cleanup(func() { _ = caddy.Stop() })
	return func(path string) string { return fmt.Sprintf("http://127.0.0.1:%d%s", port, path) }
}

// postLoop posts body to url until ctx ends, each with client.
func postLoop(ctx context.Context, client *http.Client, url, body string) {
	for ctx.Err() == nil {
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		if resp, err := client.Do(req); err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			_ = resp.Body.Close()
		}
	}
}

// An endpoint that never streams answers "stream": true in one piece,
// whatever the body says: SGLang's /flush_cache at once, with no
// Content-Type at all (Starlette's Response without a media type). A
// client posting {"stream": true} there many times a second must not
// have those answers timed as first tokens: they would outnumber
// everybody's late ones (1.5 s here, target 1 s, breach_share 0.5) and
// keep the capacity up while the backend is overloaded. Before, an
// answer without a Content-Type to a body asking for a stream was
// timed as one, on any endpoint.
func TestAdaptiveDoesNotTimeAQuickUnlabeledAnswerOfAnEndpointThatNeverStreams(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	const name = "adapt-plain-endpoint-unlabeled"
	url := adaptiveFront(t, name, `"breach_share":0.5,`, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		if r.URL.Path == "/flush_cache" {
			w.Header()["Content-Type"] = nil // none: not even the text/plain Go would sniff
			_, _ = io.WriteString(w, "Cache flushed.\n")
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		time.Sleep(1500 * time.Millisecond) // the backend is overloaded: the prefill waits
		_, _ = io.WriteString(w, "data: {}\n\n")
	}))
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for range 2 { // everybody's streams
		wg.Go(func() { postLoop(ctx, http.DefaultClient, url("/v1/chat/completions"), `{"model":"m","stream":true}`) })
	}
	for range 4 { // the client's quick answers
		wg.Go(func() { postLoop(ctx, http.DefaultClient, url("/flush_cache"), `{"model":"m","stream":true}`) })
	}
	defer func() { cancel(); wg.Wait() }()
	assert.Eventually(t, func() bool { return learnedShare(t, name) < 1 }, 20*time.Second, 50*time.Millisecond,
		"every stream's first chunk came 1.5 s after forwarding (target 1 s), and quick unlabeled answers of "+
			"/flush_cache to bodies asking for a stream kept the learned share at %v", learnedShare(t, name))
}

// vLLM's /v1/rerank, /score, /pooling, /classify and /tokenize ignore a
// "stream": true and answer in one piece, after the whole work: a
// client that gives up before that answer's header (1.2 s here, the
// answer taking 1.5 s, target 1 s) did not wait for a late first token,
// and must not bring the capacity down. Before, it counted as a stream
// whose first token never came.
func TestAdaptiveCountsNoLateFirstTokenForAClientLeavingAnEndpointThatNeverStreams(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	const name = "adapt-plain-endpoint-left"
	url := adaptiveFront(t, name, "", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		time.Sleep(1500 * time.Millisecond) // the whole work, then the plain answer
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"results":[]}`)
	}))
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	client := &http.Client{Timeout: 1200 * time.Millisecond}
	for _, path := range []string{"/v1/rerank", "/score", "/pooling", "/classify", "/tokenize"} {
		wg.Go(func() { postLoop(ctx, client, url(path), `{"model":"m","stream":true,"query":"q","documents":["a"]}`) })
	}
	defer func() { cancel(); wg.Wait() }()
	time.Sleep(6 * time.Second) // about 25 clients giving up
	assert.Equal(t, 1.0, learnedShare(t, name), "clients leaving endpoints that never stream lowered the learned share")
}
