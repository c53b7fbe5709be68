package caddyfairqueue

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
)

// Several queues in front of one backend (a queue per model, `name
// {http.fair_queue.model}`, up to 100 of them) read its gauges at the
// same URL. vLLM serves /metrics from the process that streams its
// answers: each queue reading it every interval for itself would load
// the backend with a read per queue per interval. Read once, the reading
// is every queue's: the shared URL must be read about as often as one
// that a single queue reads.
func TestBackendGaugesOfOneBackendAreReadOnceForEveryQueue(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	var sharedReads, soloReads atomic.Int32
	gauges := func(reads *atomic.Int32) *httptest.Server {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			reads.Add(1)
			_, _ = io.WriteString(w, "vllm:num_preemptions_total{model_name=\"m\"} 0\nvllm:num_requests_waiting{model_name=\"m\"} 0\n")
		}))
		t.Cleanup(srv.Close)
		return srv
	}
	shared, solo := gauges(&sharedReads), gauges(&soloReads)
	handler := func(name, url string) *Handler {
		return &Handler{Name: name, Permits: 4, Adaptive: &AdaptiveConfig{TargetTTFT: caddy.Duration(time.Second),
			Interval: caddy.Duration(100 * time.Millisecond), BackendMetrics: url}}
	}
	const queues = 8
	for i := range queues {
		provisionLocal(t, newContext(t), handler(fmt.Sprintf("gauges-shared-%d", i), shared.URL))
	}
	provisionLocal(t, newContext(t), handler("gauges-solo", solo.URL))
	deadline := time.Now().Add(30 * time.Second)
	for soloReads.Load() < 30 {
		if time.Now().After(deadline) {
			t.Fatalf("one queue read its backend's gauges %d times in 30 s", soloReads.Load())
		}
		time.Sleep(10 * time.Millisecond)
	}
	s, o := sharedReads.Load(), soloReads.Load()
	// At most a read each half interval, against one an interval: one per
	// queue, as before, is 8 times as many.
	if s > 3*o+5 {
		t.Fatalf("%d queues read one backend's gauges %d times while one queue read another's %d: a read per queue", queues, s, o)
	}
}
