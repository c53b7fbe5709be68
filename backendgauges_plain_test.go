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
	"github.com/stretchr/testify/require"
)

// A queue whose clients never stream has no time to first token to
// learn from: docs/adaptive.md says it learns from refusals and the
// backend's own gauges (backend_metrics) only. Here the backend first
// preempts and queues requests (its gauges say so at every read), and the
// learned capacity must come down; then it stops, requests wait in the
// queue, and the capacity must climb back.
func TestBackendGaugesMoveTheCapacityOfAQueueWhoseClientsNeverStream(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	var overloaded atomic.Bool
	overloaded.Store(true)
	var preemptions atomic.Int64
	metrics := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		waiting := 0
		if overloaded.Load() {
			preemptions.Add(5)
			waiting = 3
		}
		_, _ = fmt.Fprintf(w, "vllm:num_preemptions_total{model_name=\"m\"} %d\nvllm:num_requests_waiting{model_name=\"m\"} %d\n",
			preemptions.Load(), waiting)
	}))
	t.Cleanup(metrics.Close)
	h := provisionLocal(t, newContext(t), &Handler{Name: "gauges-plain", Permits: 4,
		Adaptive: &AdaptiveConfig{TargetTTFT: caddy.Duration(time.Second), MinSamples: 2, Interval: caddy.Duration(100 * time.Millisecond),
			Decrease: 0.5, Step: 0.25, BackendMetrics: metrics.URL}})
	srv := serve(t, h, proxyTo(t, http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		time.Sleep(200 * time.Millisecond)
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"choices":[{"message":{"content":"hi"}}]}`)
	})))
	// Plain (not streamed) requests: once the capacity is below 4, they
	// wait in the queue.
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				req, _ := http.NewRequestWithContext(ctx, http.MethodPost, srv.url+"/v1/chat/completions",
					strings.NewReader(`{"model":"m","stream":false}`))
				req.Header.Set("Content-Type", "application/json")
				if resp, err := http.DefaultClient.Do(req); err == nil {
					_, _ = io.Copy(io.Discard, resp.Body)
					_ = resp.Body.Close()
				}
			}
		}()
	}
	wg.Add(1)
	go func() { // the outcomes, not looked at
		defer wg.Done()
		for {
			select {
			case <-srv.outcomes:
			case <-ctx.Done():
				return
			}
		}
	}()
	defer func() { cancel(); wg.Wait() }()
	q := engineOf(t, h).q
	require.Eventually(t, func() bool { return q.Share() <= 0.5 }, 10*time.Second, 10*time.Millisecond,
		"the backend preempts at every read, and the capacity stays at its ceiling")

	overloaded.Store(false)
	low := q.Share()
	require.Eventually(t, func() bool { return q.Share() > low }, 10*time.Second, 10*time.Millisecond,
		"the backend is idle, requests wait, and the capacity stays at %v", low)
}
