package caddyfairqueue

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A request whose upstream refused it waits again, and is rejected at
// max_wait: the reject (an answer, or an event on a stream the
// keepalive committed) is the queue's, not the upstream's: it adds no
// sample to the upstream's time to first byte (which an adaptive queue
// learns from too: a stream's reject event comes max_wait after the
// forward).
func TestARequeuedRequestsRejectIsNoFirstByteOfItsUpstream(t *testing.T) {
	for _, tc := range []struct{ name, body string }{
		{"answer", `{"model":"m","messages":[]}`},
		{"event", `{"model":"m","stream":true,"messages":[]}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Cleanup(func() { poolEmpty(t) })
			name := "requeue-reject-" + tc.name
			var calls atomic.Int32
			up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				_, _ = io.Copy(io.Discard, r.Body)
				calls.Add(1)
				w.Header().Set("Retry-After", "60") // cools past max_wait: the request waits on
				w.WriteHeader(http.StatusServiceUnavailable)
			}))
			t.Cleanup(up.Close)
			dial := strings.TrimPrefix(up.URL, "http://")
			url := runCaddy(t,
				fmt.Sprintf(`{"handler":"fair_queue","name":%q,"upstreams":[{"dial":%q,"permits":1}],"requeue_on":[503],
					"max_wait":"500ms","sse_keepalive":"100ms"}`, name, dial),
				`{"handler":"reverse_proxy","dynamic_upstreams":{"source":"fair_queue"}}`)
			n0, _ := firstByteSamples(t, name, dial)

			resp, err := http.Post(url+"/v1/chat/completions", "application/json", strings.NewReader(tc.body))
			require.NoError(t, err)
			body, err := io.ReadAll(resp.Body)
			_ = resp.Body.Close()
			require.NoError(t, err)
			require.Equal(t, int32(1), calls.Load(), "refused once, then waited until max_wait")
			require.Contains(t, string(body), `"code":"timeout"`, "rejected at max_wait")
			require.Eventually(t, func() bool {
				for _, q := range queueStatus(t.Context()).Queues {
					if q.Name == name && q.Stats.InFlight == 0 && q.Stats.Waiting == 0 {
						return true
					}
				}
				return false
			}, 5*time.Second, time.Millisecond, "the request finished")
			n, _ := firstByteSamples(t, name, dial)
			assert.Equal(t, n0, n, "the reject is no first byte of the upstream's")
		})
	}
}
