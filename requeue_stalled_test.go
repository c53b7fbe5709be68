package caddyfairqueue

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/internal/redistest"
)

// A requeue_on refusal whose body stalls after its header (the upstream
// sends `503` and the start of its body, then nothing, holding the
// connection open) is held back from the client, who sees nothing of
// it: the request's wait still ends at max_wait with the timeout
// reject, not when the upstream ends that body; on a stream the
// keepalive committed while it waited, as the reject's event; also
// where the refusal's header itself comes after max_wait. In the local
// store and in Redis.
func TestARefusalWhoseBodyStallsDoesNotHoldTheRequestPastMaxWait(t *testing.T) {
	for _, tc := range []struct {
		name          string
		stream, redis bool
		after         time.Duration // before the refusal's header
	}{
		{"plain", false, false, 0}, {"committed stream", true, false, 0},
		{"plain in Redis", false, true, 0}, {"committed stream in Redis", true, true, 0},
		{"plain, refused after max_wait", false, false, 1500 * time.Millisecond},
		{"committed stream in Redis, refused after max_wait", true, true, 1500 * time.Millisecond},
	} {
		stream := tc.stream
		t.Run(tc.name, func(t *testing.T) {
			t.Cleanup(func() { poolEmpty(t) })
			release := make(chan struct{})
			holding := make(chan struct{})
			upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				_, _ = io.Copy(io.Discard, r.Body)
				if r.Header.Get("X-Quick") != "" {
					return
				}
				if r.Header.Get("X-Hold") != "" { // holds the permit while the stream waits
					close(holding)
					time.Sleep(500 * time.Millisecond)
					return
				}
				time.Sleep(tc.after)
				w.Header().Set("Content-Type", "application/json")
				w.WriteHeader(http.StatusServiceUnavailable)
				_, _ = io.WriteString(w, `{"error":`)
				_ = http.NewResponseController(w).Flush()
				select { // the rest of the body comes late, or never
				case <-release:
				case <-r.Context().Done():
				}
			}))
			t.Cleanup(upstream.Close)
			t.Cleanup(func() { close(release) })
			keepalive := ""
			if stream {
				keepalive = `"sse_keepalive":"200ms",`
			}
			if tc.redis {
				keepalive += fmt.Sprintf(`"redis":{"addresses":[%q]},`, redistest.Start(t).Addr())
			}
			url := runCaddy(t,
				fmt.Sprintf(`{"handler":"fair_queue","name":"requeue-stalled","upstreams":[{"dial":%q,"permits":1}],%s
					"requeue_on":[503],"upstream_cooldown":"100ms","max_wait":"1s"}`, strings.TrimPrefix(upstream.URL, "http://"), keepalive),
				`{"handler":"reverse_proxy","dynamic_upstreams":{"source":"fair_queue"}}`)

			client := &http.Client{Timeout: 20 * time.Second}
			if stream { // the stream waits, and the keepalive commits it
				go func() {
					req, _ := http.NewRequest(http.MethodPost, url+"/v1/chat/completions", strings.NewReader(`{}`))
					req.Header.Set("X-Hold", "1")
					if resp, err := client.Do(req); err == nil {
						resp.Body.Close()
					}
				}()
				<-holding
			}
			start := time.Now()
			body := fmt.Sprintf(`{"model":"m","messages":[],"stream":%t}`, stream)
			resp, err := client.Post(url+"/v1/chat/completions", "application/json", strings.NewReader(body))
			require.NoError(t, err, "no answer %v after the request", time.Since(start))
			got, err := io.ReadAll(resp.Body)
			resp.Body.Close()
			took := time.Since(start)
			require.NoError(t, err, "answer cut %v after the request: %q", took, got)
			if stream {
				assert.Equal(t, http.StatusOK, resp.StatusCode, "%s", got)
				assert.Contains(t, string(got), "event: error\ndata: ")
				assert.Contains(t, string(got), `"code":"timeout"`)
			} else {
				assert.Equal(t, http.StatusTooManyRequests, resp.StatusCode, "%s", got)
				assert.Equal(t, "timeout", resp.Header.Get("Fair-Queue-Reason"))
			}
			assert.NotContains(t, string(got), `{"error":{"error"`, "the refusal's body reached the client")
			assert.Less(t, took, 6*time.Second, "answered %v after the request (max_wait 1s)", took)

			// The permit was given back: a later request is served once
			// the upstream's cooldown ends.
			req, _ := http.NewRequest(http.MethodPost, url+"/v1/chat/completions", strings.NewReader(`{}`))
			req.Header.Set("X-Quick", "1")
			resp, err = client.Do(req)
			require.NoError(t, err)
			resp.Body.Close()
			assert.Equal(t, http.StatusOK, resp.StatusCode, "a later request")
		})
	}
}
