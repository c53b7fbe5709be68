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

// A backend that restarts starts its preemption counter again from 0:
// the read that finds it lower counts no preemption (not a negative
// count, nor the new value's whole history), and the reads after count
// from it, so preemptions after the restart bring the capacity down.
func TestBackendGaugesACounterThatResetsCountsFromItsNewValue(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	var counter, reads atomic.Int64
	counter.Store(5000) // the backend has run for weeks
	metrics := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		reads.Add(1)
		_, _ = fmt.Fprintf(w, "vllm:num_preemptions_total{model_name=\"m\"} %d\nvllm:num_requests_waiting{model_name=\"m\"} 0\n", counter.Load())
	}))
	t.Cleanup(metrics.Close)
	h := provisionLocal(t, newContext(t), &Handler{Name: "gauges-reset", Permits: 4,
		Adaptive: &AdaptiveConfig{TargetTTFT: caddy.Duration(time.Second), MinSamples: 1, BreachShare: 0.5, Decrease: 0.5,
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
	waitReads := func(n int64) {
		from := reads.Load()
		require.Eventually(t, func() bool { return reads.Load() >= from+n }, 10*time.Second, 10*time.Millisecond)
	}
	waitReads(3)
	counter.Store(2) // restarted: 2 preemptions since
	waitReads(5)
	assert.Equal(t, 1.0, q.Share(), "a counter that went down counted as preemptions")
	counter.Store(40) // 38 preemptions since the last read
	assert.Eventually(t, func() bool { return q.Share() < 1 }, 10*time.Second, 10*time.Millisecond,
		"preemptions after the backend restarted were not counted")
}
