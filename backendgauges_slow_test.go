package caddyfairqueue

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
)

// With a pool, each upstream's gauges are read every interval
// (docs/adaptive.md), whatever another upstream's /metrics does: a
// replica whose host is gone answers no read (each waits out its
// timeout), and the others must still be read at their pace, not one
// read each per read of the dead one (each reading is a sample: their
// windows would take twice as long to ripen, and their shares to move).
func TestBackendGaugesOfAPoolAreReadEachAtItsPaceBesideAHangingOne(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	var hangingReads, healthyReads atomic.Int32
	hanging := httptest.NewServer(http.HandlerFunc(func(_ http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/metrics" {
			hangingReads.Add(1)
			<-r.Context().Done() // never answers: the reader gives up
		}
	}))
	t.Cleanup(hanging.Close)
	healthy := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/metrics" {
			healthyReads.Add(1)
			_, _ = io.WriteString(w, "vllm:num_preemptions_total{model_name=\"m\"} 0\nvllm:num_requests_waiting{model_name=\"m\"} 0\n")
		}
	}))
	t.Cleanup(healthy.Close)
	provisionLocal(t, newContext(t), &Handler{Name: "gauges-hanging",
		Upstreams: []fairqueue.Upstream{
			{Dial: strings.TrimPrefix(hanging.URL, "http://"), Permits: 2},
			{Dial: strings.TrimPrefix(healthy.URL, "http://"), Permits: 2}},
		Adaptive: &AdaptiveConfig{TargetTTFT: caddy.Duration(time.Second), Interval: caddy.Duration(100 * time.Millisecond),
			BackendMetrics: "/metrics"}})
	// Read in turn, the healthy upstream is read once per read of the
	// hanging one, never more: each of those takes an interval.
	deadline := time.Now().Add(20 * time.Second)
	for healthyReads.Load() < hangingReads.Load()+5 {
		if time.Now().After(deadline) {
			t.Fatalf("the healthy upstream's gauges were read %d times, as often as the hanging one's (%d): each read waits for the other's",
				healthyReads.Load(), hangingReads.Load())
		}
		time.Sleep(10 * time.Millisecond)
	}
}
