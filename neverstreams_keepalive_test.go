package caddyfairqueue

import (
	"context"
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

// An endpoint that never streams (embeddings, vLLM's /v1/rerank, an
// admin endpoint) answers in one piece whatever the body or the Accept
// header says: a request there that waits in a busy queue with
// sse_keepalive gets no event-stream header and comments, which would
// wrap the plain JSON answer in a stream its client cannot read, but
// that answer as it comes. Before, a "stream": true (or Accept:
// text/event-stream) there had the keepalive commit an event stream
// while it waited, with the JSON answer inside it.
func TestTheKeepaliveFeedsNoRequestToAnEndpointThatNeverStreams(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	release := make(chan struct{})
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		if r.URL.Path == "/hold" {
			w.Header().Set("Content-Type", "text/event-stream")
			w.WriteHeader(http.StatusOK)
			w.(http.Flusher).Flush()
			<-release
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"data":[]}`)
	}))
	t.Cleanup(upstream.Close)
	port := freePort(t)
	config := fmt.Sprintf(`{"admin":{"disabled":true},"logging":{"logs":{"default":{"level":"ERROR"}}},
		"apps":{"http":{"servers":{"s":{"listen":["127.0.0.1:%d"],"routes":[{"handle":[
		{"handler":"fair_queue","name":"never-streams-keepalive","permits":1,"max_wait":"30s","sse_keepalive":"100ms"},
		{"handler":"reverse_proxy","flush_interval":-1,"upstreams":[{"dial":%q}]}]}]}}}}}`,
		port, strings.TrimPrefix(upstream.URL, "http://"))
	require.NoError(t, caddy.Load([]byte(config), false))
	t.Cleanup(func() { _ = caddy.Stop() })
	post := func(ctx context.Context, path, body string, accept bool) *http.Response {
		t.Helper()
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, fmt.Sprintf("http://127.0.0.1:%d%s", port, path), strings.NewReader(body))
		require.NoError(t, err)
		req.Header.Set("Content-Type", "application/json")
		if accept {
			req.Header.Set("Accept", "text/event-stream")
		}
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		return resp
	}
	for _, tc := range []struct {
		path, body string
		accept     bool
	}{
		{"/v1/embeddings", `{"model":"m","input":"x","stream":true}`, false},
		{"/v1/embeddings", `{"model":"m","input":"x"}`, true},
		{"/v1/rerank", `{"model":"m","query":"q","documents":["a"],"stream":true}`, false},
	} {
		t.Run(fmt.Sprintf("%s %s accept=%v", tc.path, tc.body, tc.accept), func(t *testing.T) {
			holder := post(context.Background(), "/hold", `{"model":"m","stream":true}`, false)
			defer holder.Body.Close()
			got := make(chan *http.Response, 1)
			go func() { got <- post(context.Background(), tc.path, tc.body, tc.accept) }()
			time.Sleep(500 * time.Millisecond) // keepalive ticks while it waits
			release <- struct{}{}              // the holder's answer ends: the permit is free
			var resp *http.Response
			select {
			case resp = <-got:
			case <-time.After(10 * time.Second):
				t.Fatal("no answer")
			}
			defer resp.Body.Close()
			b, _ := io.ReadAll(resp.Body)
			assert.Equal(t, http.StatusOK, resp.StatusCode)
			assert.Equal(t, "application/json", resp.Header.Get("Content-Type"), "the plain answer, as it came: %q", b)
			assert.JSONEq(t, `{"data":[]}`, string(b))
		})
	}
}
