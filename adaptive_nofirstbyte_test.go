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

// A backend so overloaded that a stream's first token never comes
// within the target (the client gives up, or reverse_proxy does) is
// the most overloaded of all: its time to first token is longer than
// the time it was waited for, which is above the target. Such a stream
// must count as a TTFT above the target; else a learned capacity hears
// of no sample at all and stays at its ceiling while every request
// times out (or is judged on the fast streams alone, the slow ones
// left out).
func TestAdaptiveCountsAStreamWhoseFirstTokenNeverCame(t *testing.T) {
	for _, tc := range []struct {
		name string
		// header: the backend sends its 200 header at once, then thinks
		header bool
		// proxyTimeout: reverse_proxy's response_header_timeout ("": none)
		proxyTimeout string
	}{
		{"the client leaves before the header", false, ""},
		{"the client leaves after the header", true, ""},
		{"reverse_proxy gives up waiting for the header", false, "300ms"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Cleanup(func() { poolEmpty(t) })
			upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				_, _ = io.Copy(io.Discard, r.Body)
				if tc.header {
					w.Header().Set("Content-Type", "text/event-stream")
					w.WriteHeader(http.StatusOK)
					w.(http.Flusher).Flush()
				}
				select { // the first token never comes
				case <-r.Context().Done():
				case <-time.After(30 * time.Second):
				}
			}))
			t.Cleanup(upstream.Close)
			transport := ""
			if tc.proxyTimeout != "" {
				transport = fmt.Sprintf(`"transport":{"protocol":"http","response_header_timeout":%q},`, tc.proxyTimeout)
			}
			name := "adapt-nofirstbyte-" + strings.ReplaceAll(tc.name, " ", "-")
			port := freePort(t)
			config := fmt.Sprintf(`{"admin":{"disabled":true},"logging":{"logs":{"default":{"level":"ERROR"}}},
		"apps":{"http":{"servers":{"s":{"listen":["127.0.0.1:%d"],"routes":[{"handle":[
		{"handler":"fair_queue","name":%q,"permits":4,
		 "adaptive":{"target_ttft":"100ms","min_samples":1,"interval":"100ms","decrease":0.5}},
		{"handler":"reverse_proxy","flush_interval":-1,%s"upstreams":[{"dial":%q}]}]}]}}}}}`,
				port, name, transport, strings.TrimPrefix(upstream.URL, "http://"))
			require.NoError(t, caddy.Load([]byte(config), false))
			t.Cleanup(func() { _ = caddy.Stop() })
			url := fmt.Sprintf("http://127.0.0.1:%d/v1/chat/completions", port)

			// Streams that each wait 300 ms or 600 ms, several times the
			// target, for a first token that never comes.
			for i := range 3 {
				ctx, cancel := context.WithTimeout(context.Background(), 600*time.Millisecond)
				req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(`{"model":"m","stream":true}`))
				require.NoError(t, err)
				req.Header.Set("Content-Type", "application/json")
				if resp, err := http.DefaultClient.Do(req); err == nil {
					_, _ = io.Copy(io.Discard, resp.Body)
					_ = resp.Body.Close()
				}
				cancel()
				if i < 2 {
					time.Sleep(200 * time.Millisecond) // past the interval: the next one reports
				}
			}
			assert.Eventually(t, func() bool { return learnedShare(t, name) < 1 }, 5*time.Second, 20*time.Millisecond,
				"3 streams waited 300 ms or more each for a first token that never came (target 100 ms), and the learned share stays at %v",
				learnedShare(t, name))
		})
	}
}
