package caddyfairqueue

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/stretchr/testify/require"
)

// Two queues read one backend's gauges under different intervals: each
// read's timeout is its queue's interval. A backend whose /metrics takes
// longer than the shorter interval (a loaded vLLM serves it from the
// process that streams its answers) fails every read of the queue with
// that interval, by its own settings; the other queue's reads, whose
// timeout is longer, must still succeed, as they did when each queue read
// for itself: a read shared between them (backendgauges_shared.go) may
// not hand it the failures of reads cut at the shorter timeout.
func TestBackendGaugesSharedBetweenIntervalsKeepEachQueuesTimeout(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	metrics := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select { // a loaded backend: each read takes 400 ms
		case <-time.After(400 * time.Millisecond):
		case <-r.Context().Done():
			return
		}
		_, _ = io.WriteString(w, "vllm:num_preemptions_total{model_name=\"m\"} 0\nvllm:num_requests_waiting{model_name=\"m\"} 3\n")
	}))
	t.Cleanup(metrics.Close)
	port := freePort(t)
	queue := func(name, interval string) string {
		return fmt.Sprintf(`{"match":[{"path":["/%s"]}],"handle":[
		{"handler":"fair_queue","name":%q,"permits":4,
		 "adaptive":{"target_ttft":"1s","min_samples":1,"interval":%q,"decrease":0.5,"backend_metrics":%q}},
		{"handler":"static_response","body":"ok"}]}`, name, name, interval, metrics.URL)
	}
	config := fmt.Sprintf(`{"admin":{"disabled":true},"logging":{"logs":{"default":{"level":"ERROR"}}},
		"apps":{"http":{"servers":{"s":{"listen":["127.0.0.1:%d"],"routes":[%s,%s]}}}}}`,
		port, queue("gauges-short", "150ms"), queue("gauges-long", "1500ms"))
	require.NoError(t, caddy.Load([]byte(config), false))
	t.Cleanup(func() { _ = caddy.Stop() })
	for _, name := range []string{"gauges-short", "gauges-long"} { // each queue joins: its readings count
		resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/%s", port, name))
		require.NoError(t, err)
		_, _ = io.Copy(io.Discard, resp.Body)
		_ = resp.Body.Close()
	}
	require.Eventually(t, func() bool { return learnedShare(t, "gauges-long") < 1 }, 20*time.Second, 20*time.Millisecond,
		"the backend shows requests queued in it at every read, which takes 400 ms; the queue reading it every 1.5 s "+
			"(its timeout) never got a reading: its learned share stays at %v", learnedShare(t, "gauges-long"))
}
