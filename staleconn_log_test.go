package caddyfairqueue

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The debug line of a request sent again after a stale connection (no
// cooldown: the upstream failed nothing it read) said "cooldown":"-1ns",
// the sentinel of no cooldown written as a duration. It says none: the
// field is left out, as the upstream does not cool.
func TestAStaleConnectionRequeueLogsNoCooldown(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	u := newStaleUpstream(t)
	logFile := filepath.Join(t.TempDir(), "caddy.log")
	port := freePort(t)
	require.NoError(t, caddy.Load([]byte(fmt.Sprintf(`{"admin":{"disabled":true},"logging":{"logs":{"default":{"level":"DEBUG",
		"writer":{"output":"file","filename":%q},"encoder":{"format":"json"},"include":["http.handlers.fair_queue"]}}},
	"apps":{"http":{"servers":{"s":{"listen":["127.0.0.1:%d"],"routes":[{"handle":[
		{"handler":"fair_queue","name":"stale-log","upstreams":[{"dial":%q,"permits":1}],"max_wait":"20s"},
		{"handler":"reverse_proxy","dynamic_upstreams":{"source":"fair_queue"}}]}]}}}}}`,
		logFile, port, u.ln.Addr().String())), false))
	t.Cleanup(func() { _ = caddy.Stop() })
	url := fmt.Sprintf("http://127.0.0.1:%d/v1/chat/completions", port)
	for range 3 {
		resp, err := http.Post(url, "application/json", strings.NewReader(`{"model":"m","messages":[]}`))
		require.NoError(t, err)
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		require.Equal(t, http.StatusOK, resp.StatusCode)
	}
	require.Positive(t, u.dropped.Load(), "a request was sent on a connection the upstream dropped")
	require.NoError(t, caddy.Stop()) // flushes the log

	raw, err := os.ReadFile(logFile)
	require.NoError(t, err)
	var requeued []map[string]any
	for line := range strings.Lines(string(raw)) {
		var e map[string]any
		if json.Unmarshal([]byte(line), &e) == nil && e["msg"] == "upstream refused the request; requeued" {
			requeued = append(requeued, e)
		}
	}
	require.NotEmpty(t, requeued, "the log says: %s", raw)
	for _, e := range requeued {
		assert.Equal(t, reasonStale, e["reason"], e)
		assert.NotContains(t, e, "cooldown", "the upstream does not cool")
	}
}
