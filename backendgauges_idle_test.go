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
	"github.com/stretchr/testify/require"
)

// An instance that has not joined its queue yet (no request came since
// it started) reads the backend's gauges but reports nothing (an idle
// instance leaves no key in Redis). What it read then is old by the time
// its first request joins the queue: an hour of readings judged in the
// window of the interval after would move the share by what the backend
// did an hour ago. Here the backend queued requests while the instance
// was idle, and stopped before its first request: the share must stay
// whole.
func TestBackendGaugesReadBeforeTheQueueOpenedAreNotReportedLater(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	var waiting, reads atomic.Int64
	waiting.Store(3)
	metrics := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		reads.Add(1)
		_, _ = fmt.Fprintf(w, "vllm:num_preemptions_total{model_name=\"m\"} 0\nvllm:num_requests_waiting{model_name=\"m\"} %d\n", waiting.Load())
	}))
	t.Cleanup(metrics.Close)
	h := provisionLocal(t, newContext(t), &Handler{Name: "gauges-idle", Permits: 4,
		Adaptive: &AdaptiveConfig{TargetTTFT: caddy.Duration(time.Second), MinSamples: 10, BreachShare: 0.5, Decrease: 0.5,
			Interval: caddy.Duration(100 * time.Millisecond), BackendMetrics: metrics.URL}})
	require.Eventually(t, func() bool { return reads.Load() >= 20 }, 20*time.Second, 10*time.Millisecond,
		"the gauges are read before any request")
	waiting.Store(0) // the backend's queue drained before the first request came
	from := reads.Load()
	require.Eventually(t, func() bool { return reads.Load() >= from+2 }, 10*time.Second, 10*time.Millisecond)

	srv := serve(t, h, proxyTo(t, http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"choices":[]}`)
	})))
	resp := srv.post(t, context.Background(), `{"model":"m"}`) // joins the queue
	_, _ = io.Copy(io.Discard, resp.Body)
	_ = resp.Body.Close()
	srv.outcome(t)
	q := engineOf(t, h).q
	from = reads.Load()
	require.Eventually(t, func() bool { return reads.Load() >= from+15 }, 20*time.Second, 10*time.Millisecond)
	assert.Equal(t, 1.0, q.Share(), "readings from before the queue opened (the backend queued then) brought the share down after")
}
