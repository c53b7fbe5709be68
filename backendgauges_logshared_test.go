package caddyfairqueue

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Several queues in front of one backend (a queue per model) share its
// gauges' reads (backendgauges_shared.go): a wrong path fails the reads
// of every queue, and a backend that restarts fails them a while, each
// time. The log must say so once per failure streak of the URL, as for
// one queue, not once per queue (a warn and an info line per queue, up
// to 100 of them, at each restart of the backend).
func TestBackendGaugesSharedByQueuesThatFailToReadAreLoggedOnce(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	var reads atomic.Int32
	backend := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		reads.Add(1)
		http.NotFound(w, r)
	}))
	t.Cleanup(backend.Close)
	logFile := loadGaugeQueues(t, "gauges-typo", backend.URL+"/metric")
	require.Eventually(t, func() bool { return reads.Load() >= 5 }, 10*time.Second, 10*time.Millisecond)
	time.Sleep(300 * time.Millisecond) // every queue's reads failed by now, three intervals
	require.NoError(t, caddy.Stop())   // flushes the log

	raw, err := os.ReadFile(logFile)
	require.NoError(t, err)
	var warned []string
	for line := range strings.Lines(string(raw)) {
		if strings.Contains(line, "backend gauges") {
			warned = append(warned, line)
		}
	}
	assert.Len(t, warned, 1, "3 queues read %s, which failed (404) %d times, and the log says: %s", backend.URL+"/metric", reads.Load(), raw)
}

// A backend that restarts fails the reads of every queue a while: one
// warn line when they start failing, one info line when a read succeeds
// again, for all the queues that share the reads.
func TestBackendGaugesSharedByQueuesLogTheirRecoveryOnce(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	var reads atomic.Int32
	backend := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if reads.Add(1) <= 3 { // restarting
			http.Error(w, "starting", http.StatusServiceUnavailable)
			return
		}
		_, _ = fmt.Fprint(w, "vllm:num_preemptions_total{model_name=\"m\"} 0\nvllm:num_requests_waiting{model_name=\"m\"} 0\n")
	}))
	t.Cleanup(backend.Close)
	logFile := loadGaugeQueues(t, "gauges-restart", backend.URL+"/metrics")
	require.Eventually(t, func() bool { return reads.Load() >= 8 }, 10*time.Second, 10*time.Millisecond)
	require.NoError(t, caddy.Stop()) // flushes the log

	raw, err := os.ReadFile(logFile)
	require.NoError(t, err)
	var warned, recovered int
	for line := range strings.Lines(string(raw)) {
		switch {
		case strings.Contains(line, "backend gauges unread"):
			warned++
			assert.Contains(t, line, `"level":"warn"`)
		case strings.Contains(line, "backend gauges read again"):
			recovered++
			assert.Contains(t, line, `"level":"info"`)
		}
	}
	assert.Equal(t, [2]int{1, 1}, [2]int{warned, recovered}, "3 queues share the reads of a backend that failed 3 of them, then recovered: warn and info lines; the log says: %s", raw)
}

// loadGaugeQueues runs Caddy with three queues (name-0 to name-2) that
// read the gauges at url every 100ms, its log at INFO level in the file
// it returns.
func loadGaugeQueues(t *testing.T, name, url string) (logFile string) {
	t.Helper()
	logFile = filepath.Join(t.TempDir(), "caddy.log")
	port := freePort(t)
	var routes []string
	for i := range 3 {
		routes = append(routes, fmt.Sprintf(`{"match":[{"path":["/%d"]}],"handle":[
		{"handler":"fair_queue","name":"%s-%d","permits":4,
		 "adaptive":{"target_ttft":"1s","interval":"100ms","backend_metrics":%q}},
		{"handler":"static_response","body":"ok"}]}`, i, name, i, url))
	}
	config := fmt.Sprintf(`{"admin":{"disabled":true},"logging":{"logs":{"default":{"level":"INFO",
		"writer":{"output":"file","filename":%q}}}},
		"apps":{"http":{"servers":{"s":{"listen":["127.0.0.1:%d"],"routes":[%s]}}}}}`, logFile, port, strings.Join(routes, ","))
	require.NoError(t, caddy.Load([]byte(config), false))
	t.Cleanup(func() { _ = caddy.Stop() })
	return logFile
}
