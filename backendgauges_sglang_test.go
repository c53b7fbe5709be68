package caddyfairqueue

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// sglangMetrics is SGLang's /metrics (python/sglang/srt/metrics/
// collector.py) for two tensor-parallel ranks: the requests in each
// rank's waiting queue (sglang:num_queue_reqs, a gauge), the requests
// retracted since the engine started (sglang:num_retracted_requests_total,
// a counter), and the retractions of the last logged batch
// (sglang:num_retracted_reqs, a gauge that is no count since the last
// read).
func sglangMetrics(retracted [2]int64, queued [2]int, lastBatchRetracted int) string {
	var b strings.Builder
	labels := func(rank int) string {
		return fmt.Sprintf(`{engine_type="unified",model_name="meta-llama/Llama-3.1-8B-Instruct",pp_rank="0",tp_rank="%d"}`, rank)
	}
	b.WriteString("# HELP sglang:num_queue_reqs The number of requests in the waiting queue.\n# TYPE sglang:num_queue_reqs gauge\n")
	for rank := range 2 {
		fmt.Fprintf(&b, "sglang:num_queue_reqs%s %d.0\n", labels(rank), queued[rank])
	}
	b.WriteString("# HELP sglang:num_grammar_queue_reqs The number of requests in the grammar waiting queue.\n# TYPE sglang:num_grammar_queue_reqs gauge\n")
	fmt.Fprintf(&b, "sglang:num_grammar_queue_reqs%s 0.0\n", labels(0))
	b.WriteString("# HELP sglang:num_retracted_reqs The number of retracted requests.\n# TYPE sglang:num_retracted_reqs gauge\n")
	fmt.Fprintf(&b, "sglang:num_retracted_reqs%s %d.0\n", labels(0), lastBatchRetracted)
	b.WriteString("# HELP sglang:num_retracted_requests_total Total number of retracted requests.\n# TYPE sglang:num_retracted_requests_total counter\n")
	for rank := range 2 {
		fmt.Fprintf(&b, "sglang:num_retracted_requests_total%s %d.0\n", labels(rank), retracted[rank])
		fmt.Fprintf(&b, "sglang:num_retracted_requests_created%s 1.7964659e+09\n", labels(rank))
	}
	return b.String()
}

func TestBackendGaugesAreReadFromSGLangsMetrics(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		_, _ = io.WriteString(w, sglangMetrics([2]int64{6, 4}, [2]int{2, 1}, 40))
	}))
	defer srv.Close()
	g, err := readGauges(context.Background(), srv.Client(), srv.URL, time.Second)
	require.NoError(t, err)
	assert.Equal(t, backendGauges{preemptions: 10, waiting: 3}, g,
		"each rank's retractions and queued requests summed; the last batch's retractions (a gauge) and the grammar queue left out")
}

// An operator running SGLang behind an adaptive queue with
// backend_metrics: while the engine retracts and queues requests, the
// learned capacity must come down, as with vLLM's gauges; once it stops,
// requests wait in the queue and it must climb back, though SGLang still
// shows the retractions of the last batch it logged
// (sglang:num_retracted_reqs), which no longer happen.
func TestSGLangsGaugesMoveTheCapacityThroughCaddy(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	var overloaded atomic.Bool
	overloaded.Store(true)
	var retracted atomic.Int64
	metrics := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		queued := [2]int{}
		if overloaded.Load() {
			retracted.Add(5)
			queued = [2]int{3, 2}
		}
		n := retracted.Load()
		_, _ = io.WriteString(w, sglangMetrics([2]int64{n, n}, queued, 7))
	}))
	t.Cleanup(metrics.Close)
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		time.Sleep(200 * time.Millisecond)
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"choices":[{"message":{"content":"hi"}}]}`)
	}))
	t.Cleanup(upstream.Close)

	port := freePort(t)
	config := fmt.Sprintf(`{"admin":{"disabled":true},"logging":{"logs":{"default":{"level":"ERROR"}}},
		"apps":{"http":{"servers":{"s":{"listen":["127.0.0.1:%d"],"routes":[{"handle":[
		{"handler":"fair_queue","name":"sglang-gauges","permits":4,"max_wait":"60s",
		 "adaptive":{"target_ttft":"1s","min_samples":2,"interval":"100ms","decrease":0.5,"step":0.25,"backend_metrics":%q}},
		{"handler":"reverse_proxy","upstreams":[{"dial":%q}]}]}]}}}}}`,
		port, metrics.URL, strings.TrimPrefix(upstream.URL, "http://"))
	require.NoError(t, caddy.Load([]byte(config), false))
	t.Cleanup(func() { _ = caddy.Stop() })
	url := fmt.Sprintf("http://127.0.0.1:%d/v1/chat/completions", port)

	// Plain (not streamed) requests, never timed: the gauges are all the
	// queue learns from. Once the capacity is below 4, they wait.
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				req, _ := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(`{"model":"m","stream":false}`))
				req.Header.Set("Content-Type", "application/json")
				if resp, err := http.DefaultClient.Do(req); err == nil {
					_, _ = io.Copy(io.Discard, resp.Body)
					_ = resp.Body.Close()
				}
			}
		}()
	}
	defer func() { cancel(); wg.Wait() }()

	require.Eventually(t, func() bool { return learnedShare(t, "sglang-gauges") <= 0.5 }, 10*time.Second, 20*time.Millisecond,
		"SGLang retracts and queues requests at every read, and the capacity stays at %v", learnedShare(t, "sglang-gauges"))

	overloaded.Store(false)
	low := learnedShare(t, "sglang-gauges")
	require.Eventually(t, func() bool { return learnedShare(t, "sglang-gauges") > low }, 10*time.Second, 20*time.Millisecond,
		"SGLang is idle (the last batch's retractions still shown), requests wait, and the capacity stays at %v", low)
}
