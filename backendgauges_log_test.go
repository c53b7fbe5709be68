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

// An operator whose backend_metrics names a path the backend does not
// serve (a typo: /metric) must hear of it in Caddy's log at its default
// level: every read fails, and the gauges the operator asked for are
// never read. Once, not at every interval.
func TestBackendGaugesThatFailToReadAreLoggedOnce(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	var reads atomic.Int32
	backend := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/metric" {
			reads.Add(1)
		}
		http.NotFound(w, r)
	}))
	t.Cleanup(backend.Close)
	logFile := filepath.Join(t.TempDir(), "caddy.log")
	port := freePort(t)
	config := fmt.Sprintf(`{"admin":{"disabled":true},"logging":{"logs":{"default":{"level":"INFO",
		"writer":{"output":"file","filename":%q}}}},
		"apps":{"http":{"servers":{"s":{"listen":["127.0.0.1:%d"],"routes":[{"handle":[
		{"handler":"fair_queue","name":"gauges-typo","permits":4,
		 "adaptive":{"target_ttft":"1s","interval":"100ms","backend_metrics":%q}},
		{"handler":"static_response","body":"ok"}]}]}}}}}`, logFile, port, backend.URL+"/metric")
	require.NoError(t, caddy.Load([]byte(config), false))
	t.Cleanup(func() { _ = caddy.Stop() })
	require.Eventually(t, func() bool { return reads.Load() >= 5 }, 10*time.Second, 10*time.Millisecond)
	require.NoError(t, caddy.Stop()) // flushes the log

	raw, err := os.ReadFile(logFile)
	require.NoError(t, err)
	var warned []string
	for line := range strings.Lines(string(raw)) {
		if strings.Contains(line, "backend gauges") {
			warned = append(warned, line)
		}
	}
	if assert.Len(t, warned, 1, "%d reads of %s failed (404), and the log says: %s", reads.Load(), backend.URL+"/metric", raw) {
		assert.Contains(t, warned[0], `"level":"warn"`)
		assert.Contains(t, warned[0], backend.URL+"/metric")
		assert.Contains(t, warned[0], "404")
	}
}
