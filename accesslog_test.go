package caddyfairqueue

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
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

// accessLogEntries reads the JSON access log at path.
func accessLogEntries(t *testing.T, path string) []map[string]any {
	t.Helper()
	f, err := os.Open(path)
	if os.IsNotExist(err) {
		return nil
	}
	require.NoError(t, err)
	defer f.Close()
	var out []map[string]any
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var e map[string]any
		require.NoError(t, json.Unmarshal(sc.Bytes(), &e), sc.Text())
		out = append(out, e)
	}
	return out
}

// With a pool, the access log's fair_queue object names the upstream
// that served the request (docs/pools.md: "{http.fair_queue.upstream}
// names it in logs"; docs/reference.md: the placeholders appear in the
// access log as a fair_queue object): after a requeue, the last one.
func TestAccessLogNamesThePoolUpstreamThatServedTheRequest(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	var refused atomic.Int32
	refusing := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		refused.Add(1)
		w.WriteHeader(http.StatusServiceUnavailable)
	}))
	t.Cleanup(refusing.Close)
	serving := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		_, _ = io.WriteString(w, "ok")
	}))
	t.Cleanup(serving.Close)
	bad, good := strings.TrimPrefix(refusing.URL, "http://"), strings.TrimPrefix(serving.URL, "http://")

	logPath := filepath.Join(t.TempDir(), "access.log")
	port := freePort(t)
	cfg := fmt.Sprintf(`{"admin":{"disabled":true},"logging":{"logs":{
		"default":{"level":"ERROR","exclude":["http.log.access"]},
		"access":{"writer":{"output":"file","filename":%q},"encoder":{"format":"json"},"include":["http.log.access"]}}},
	"apps":{"http":{"servers":{"s":{"listen":["127.0.0.1:%d"],"logs":{},"routes":[{"handle":[
		{"handler":"fair_queue","name":"access-log-pool","upstreams":[{"dial":%q,"permits":1},{"dial":%q,"permits":1}],
			"requeue_on":[503],"upstream_cooldown":"1m"},
		{"handler":"reverse_proxy","dynamic_upstreams":{"source":"fair_queue"}}]}]}}}}}`, logPath, port, bad, good)
	require.NoError(t, caddy.Load([]byte(cfg), false))
	t.Cleanup(func() { _ = caddy.Stop() })

	// Equal upstreams take turns: the first or the second request goes
	// to the refusing one, is requeued, and it cools for a minute.
	const n = 3
	for range n {
		resp, err := http.Post(fmt.Sprintf("http://127.0.0.1:%d/v1/chat/completions", port), "application/json",
			strings.NewReader(`{"model":"m","messages":[]}`))
		require.NoError(t, err)
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		require.Equal(t, http.StatusOK, resp.StatusCode)
	}
	require.Equal(t, int32(1), refused.Load(), "one request was requeued")
	var entries []map[string]any
	require.Eventually(t, func() bool { entries = accessLogEntries(t, logPath); return len(entries) == n },
		10*time.Second, 20*time.Millisecond, "the access log holds %d entries, want %d", len(entries), n)
	for _, e := range entries {
		fq, ok := e["fair_queue"].(map[string]any)
		require.True(t, ok, "no fair_queue object in %v", e)
		assert.Equal(t, "granted", fq["outcome"])
		assert.Equal(t, good, fq["upstream"], "the upstream that served it, in %v", fq)
	}
}
