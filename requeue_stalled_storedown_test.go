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
)

// A requeue_on refusal whose body stalls, of a request admitted while
// Redis cannot be reached (on_store_error fail_open: a permit of no
// store; local: the fallback queue's), is bounded by the request's
// max_wait as one granted by Redis: the client gets the timeout reject
// at once once max_wait has passed, and the permit is given back.
func TestAStalledRefusalIsBoundedWhileRedisIsDown(t *testing.T) {
	for _, policy := range []string{"fail_open", "local"} {
		t.Run(policy, func(t *testing.T) {
			t.Cleanup(func() { poolEmpty(t) })
			release := make(chan struct{})
			upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				_, _ = io.Copy(io.Discard, r.Body)
				if r.Header.Get("X-Quick") != "" {
					return
				}
				w.WriteHeader(http.StatusServiceUnavailable)
				_, _ = io.WriteString(w, `{"error":`)
				_ = http.NewResponseController(w).Flush()
				select {
				case <-release:
				case <-r.Context().Done():
				}
			}))
			t.Cleanup(upstream.Close)
			t.Cleanup(func() { close(release) })
			down := fmt.Sprintf("127.0.0.1:%d", freePort(t)) // nothing listens there
			url := runCaddy(t,
				fmt.Sprintf(`{"handler":"fair_queue","name":"requeue-stalled-down-%s","upstreams":[{"dial":%q,"permits":1}],
					"requeue_on":[503],"upstream_cooldown":"100ms","max_wait":"1s","on_store_error":%q,
					"redis":{"addresses":[%q]}}`, policy, strings.TrimPrefix(upstream.URL, "http://"), policy, down),
				`{"handler":"reverse_proxy","dynamic_upstreams":{"source":"fair_queue"}}`)

			client := &http.Client{Timeout: 20 * time.Second}
			start := time.Now()
			resp, err := client.Post(url+"/v1/chat/completions", "application/json", strings.NewReader(`{"model":"m","messages":[]}`))
			require.NoError(t, err, "no answer %v after the request", time.Since(start))
			got, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			took := time.Since(start)
			assert.Equal(t, http.StatusTooManyRequests, resp.StatusCode, "%s", got)
			assert.Equal(t, "timeout", resp.Header.Get("Fair-Queue-Reason"), "%s", got)
			assert.Less(t, took, 6*time.Second, "answered %v after the request (max_wait 1s)", took)

			req, _ := http.NewRequest(http.MethodPost, url+"/v1/chat/completions", strings.NewReader(`{}`))
			req.Header.Set("X-Quick", "1")
			resp, err = client.Do(req)
			require.NoError(t, err)
			resp.Body.Close()
			assert.Equal(t, http.StatusOK, resp.StatusCode, "a later request")
		})
	}
}
