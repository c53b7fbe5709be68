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

// vLLM and SGLang read "stream" with pydantic's lax bool: 1, 1.0, and
// the strings "true", "1", "yes", "on", "t", "y" in any letter case
// stream (0, "false", "no", "off", "f", "n", "0" do not). Ollama's /v1
// (Go's encoding/json into a bool) refuses such a body with 400, so its
// reading cannot disagree with the backend's: the handler reads them as
// streaming, as the backend that takes them does. A client sending one
// to a busy queue with sse_keepalive gets the event-stream header and
// keepalive comments while it waits, and its reject as an SSE error
// event, the way its stream would have come. Before, they were read as
// not streaming: the client waited without a byte and got a JSON 429
// where its SSE parser expected events.
func TestAStreamPydanticReadsLaxlyGetsTheKeepaliveAndAnSSEReject(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	release := make(chan struct{})
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(http.StatusOK)
		w.(http.Flusher).Flush()
		<-release // the request that holds the only permit
		_, _ = io.WriteString(w, "data: [DONE]\n\n")
	}))
	t.Cleanup(upstream.Close)
	t.Cleanup(func() { close(release) })
	port := freePort(t)
	config := fmt.Sprintf(`{"admin":{"disabled":true},"logging":{"logs":{"default":{"level":"ERROR"}}},
		"apps":{"http":{"servers":{"s":{"listen":["127.0.0.1:%d"],"routes":[{"handle":[
		{"handler":"fair_queue","name":"lax-stream","permits":1,"max_wait":"700ms","sse_keepalive":"100ms"},
		{"handler":"reverse_proxy","flush_interval":-1,"upstreams":[{"dial":%q}]}]}]}}}}}`,
		port, strings.TrimPrefix(upstream.URL, "http://"))
	require.NoError(t, caddy.Load([]byte(config), false))
	t.Cleanup(func() { _ = caddy.Stop() })
	url := fmt.Sprintf("http://127.0.0.1:%d/v1/chat/completions", port)
	post := func(ctx context.Context, body string) *http.Response {
		t.Helper()
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(body))
		require.NoError(t, err)
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		return resp
	}
	holder := post(context.Background(), `{"model":"m","stream":true,"messages":[]}`)
	require.Equal(t, "text/event-stream", holder.Header.Get("Content-Type"))
	t.Cleanup(func() { _ = holder.Body.Close() })

	// And 1 written with 5000 zeros, which Python reads as 1.0.
	long := `1` + strings.Repeat("0", 5000) + `e-5000`
	for _, stream := range []string{`1`, `1.0`, `"true"`, `"True"`, `"1"`, `"yes"`, `"on"`, `"t"`, `"Y"`, `"\u0074rue"`, long} {
		t.Run(fmt.Sprintf("%.12s", stream), func(t *testing.T) {
			body := `{"model":"m","stream":` + stream + `,"messages":[]}`
			resp := post(context.Background(), body)
			defer resp.Body.Close()
			all, _ := io.ReadAll(resp.Body)
			require.Equal(t, "text/event-stream", resp.Header.Get("Content-Type"),
				"vLLM streams %.80s: status %d, body %s", body, resp.StatusCode, all)
			assert.Equal(t, http.StatusOK, resp.StatusCode)
			assert.Contains(t, string(all), ": queued", "keepalive comments while it waited")
			assert.Contains(t, string(all), "event: error\ndata: {", "the reject, as an SSE error event")
		})
	}
	// What pydantic reads as false, or refuses, stays plain: a JSON 429.
	for _, stream := range []string{`0`, `"false"`, `"no"`, `"off"`, `"0"`, `2`, `"maybe"`, `" true"`} {
		t.Run(stream, func(t *testing.T) {
			start := time.Now()
			resp := post(context.Background(), `{"model":"m","stream":`+stream+`,"messages":[]}`)
			defer resp.Body.Close()
			all, _ := io.ReadAll(resp.Body)
			assert.Equal(t, http.StatusTooManyRequests, resp.StatusCode, "%s", all)
			assert.Equal(t, "application/json", resp.Header.Get("Content-Type"))
			assert.GreaterOrEqual(t, time.Since(start), 600*time.Millisecond, "it waited max_wait")
		})
	}
}
