package caddyfairqueue

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
)

func TestBackendGaugesAreReadFromVLLMsMetrics(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		_, _ = io.WriteString(w, `# HELP vllm:num_preemptions_total Cumulative number of preemption from the engine.
# TYPE vllm:num_preemptions_total counter
vllm:num_preemptions_total{engine="0",model_name="llama 8b"} 7
vllm:num_preemptions_total{engine="1",model_name="llama 8b"} 3 1796465915000
vllm:num_requests_waiting{model_name="x"} 2
vllm:num_requests_waiting_by_reason{reason="capacity"} 100
vllm:num_requests_running 5
`)
	}))
	defer srv.Close()
	g, err := readGauges(context.Background(), srv.Client(), srv.URL, time.Second)
	require.NoError(t, err)
	assert.Equal(t, backendGauges{preemptions: 10, waiting: 2}, g, "every series summed, a label value with a space, a timestamp, a longer name left out")
}

func TestBackendGaugesURLsArePerUpstreamOrTheOne(t *testing.T) {
	ups := []fairqueue.Upstream{{Dial: "10.0.0.5:8000", Permits: 4}, {Dial: "10.0.0.6:8000", Permits: 4}}
	assert.Equal(t, map[string]string{"10.0.0.5:8000": "http://10.0.0.5:8000/metrics", "10.0.0.6:8000": "http://10.0.0.6:8000/metrics"},
		gaugeURLs(fairqueue.Config{Upstreams: ups, Adaptive: &fairqueue.Adaptive{BackendMetrics: "/metrics"}}))
	assert.Equal(t, map[string]string{"": "http://vllm:8000/metrics"},
		gaugeURLs(fairqueue.Config{Adaptive: &fairqueue.Adaptive{BackendMetrics: "http://vllm:8000/metrics"}}))
}

func TestBackendMetricsMustMatchThePool(t *testing.T) {
	_, err := parse("fair_queue {\npermits 4\nadaptive {\ntarget_ttft 1s\nbackend_metrics /metrics\n}\n}")
	require.Error(t, err)
	assert.Contains(t, err.Error(), "backend_metrics \"/metrics\" is a path, read on each pool upstream")
	_, err = parse("fair_queue {\nupstream a:1 4\nadaptive {\ntarget_ttft 1s\nbackend_metrics http://a:1/metrics\n}\n}")
	require.Error(t, err)
	assert.Contains(t, err.Error(), "with upstream lines, give a path")
	h, err := parse("fair_queue {\nupstream a:1 4\nadaptive {\ntarget_ttft 1s\nbackend_metrics /metrics\n}\n}")
	require.NoError(t, err)
	assert.Equal(t, "/metrics", h.settings().cfg.Adaptive.BackendMetrics)
}

// A read of the backend's gauges that fails is skipped (docs/adaptive.md),
// an error status too: the preemptions counted at the next read are those
// since the last read that succeeded, not every one since the backend
// started. Here the backend preempts nothing at all, its metrics endpoint
// fails once, and the share must stay whole.
func TestBackendGaugesAnErrorStatusIsAReadSkipped(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	var reads atomic.Int32
	metrics := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		if reads.Add(1) == 2 {
			http.Error(w, "metrics unavailable", http.StatusServiceUnavailable)
			return
		}
		_, _ = io.WriteString(w, "vllm:num_preemptions_total{model_name=\"m\"} 5000\nvllm:num_requests_waiting{model_name=\"m\"} 0\n")
	}))
	t.Cleanup(metrics.Close)
	h := provisionLocal(t, newContext(t), &Handler{Name: "gauges-error-status", Permits: 4,
		Adaptive: &AdaptiveConfig{TargetTTFT: caddy.Duration(time.Second), MinSamples: 1, Interval: caddy.Duration(100 * time.Millisecond),
			BackendMetrics: metrics.URL}})
	srv := serve(t, h, proxyTo(t, http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"choices":[]}`)
	})))
	require.Eventually(t, func() bool { return reads.Load() >= 4 }, 5*time.Second, 10*time.Millisecond)
	q := engineOf(t, h).q
	for range 5 { // fast streamed answers: the window ripens
		resp := srv.post(t, context.Background(), `{"model":"m","stream":true}`)
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		time.Sleep(150 * time.Millisecond)
	}
	require.Eventually(t, func() bool { _, ok := q.Shares()[""]; return ok }, 2*time.Second, 10*time.Millisecond, "nothing learned")
	assert.Equal(t, 1.0, q.Shares()[""], "no request was preempted: a failed read counted the backend's whole counter")
}
