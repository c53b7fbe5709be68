package caddyfairqueue

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/stretchr/testify/assert"
)

// A backend's preemption counter is a float in its Prometheus text: a
// value past what an int holds (a counter that wrapped or a broken
// exporter) or one that is not a number (+Inf) must not make a reading
// vanish nor count as fewer preemptions than none. Here the backend
// queues requests at every read (vllm:num_requests_waiting 3) and its
// counter grows by huge amounts: every reading is an overloaded one, and
// the learned capacity must come down. (A counter past 2^63 made every
// reading but the first vanish; +Inf, half of them.)
func TestBackendGaugesAHugeOrInfinitePreemptionCounterStillCounts(t *testing.T) {
	for _, tc := range []struct {
		name string
		at   func(read int64) string // the counter at the read-th read (0: the first)
	}{
		{"past 2^63 at every read", func(read int64) string { return fmt.Sprintf("%g", float64(read)*1e19) }},
		{"+Inf every other read", func(read int64) string {
			if read%2 == 1 {
				return "+Inf"
			}
			return "0"
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Cleanup(func() { poolEmpty(t) })
			var reads atomic.Int64
			metrics := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
				_, _ = fmt.Fprintf(w, "vllm:num_preemptions_total{model_name=\"m\"} %s\nvllm:num_requests_waiting{model_name=\"m\"} 3\n",
					tc.at(reads.Add(1)-1))
			}))
			t.Cleanup(metrics.Close)
			h := provisionLocal(t, newContext(t), &Handler{Name: "gauges-huge", Permits: 4,
				Adaptive: &AdaptiveConfig{TargetTTFT: caddy.Duration(time.Second), MinSamples: 4, Decrease: 0.5,
					Interval: caddy.Duration(100 * time.Millisecond), BackendMetrics: metrics.URL}})
			srv := serve(t, h, proxyTo(t, http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
				w.Header().Set("Content-Type", "application/json")
				_, _ = io.WriteString(w, `{"choices":[]}`)
			})))
			resp := srv.post(t, context.Background(), `{"model":"m"}`) // joins the queue
			_, _ = io.Copy(io.Discard, resp.Body)
			_ = resp.Body.Close()
			srv.outcome(t)
			q := engineOf(t, h).q
			if !assert.Eventually(t, func() bool { return q.Share() <= 0.5 }, 10*time.Second, 10*time.Millisecond) {
				t.Fatalf("the backend queued requests at each of %d reads, and the capacity stays at %v", reads.Load(), q.Share())
			}
		})
	}
}
