package caddyfairqueue

import (
	"bufio"
	"context"
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

	"github.com/fair-queue/caddy-fair-queue/internal/redistest"
)

// queueLogLines returns the lines of logger http.handlers.fair_queue in
// the JSON log at path, each as its fields.
func queueLogLines(t *testing.T, path string) []map[string]any {
	t.Helper()
	f, err := os.Open(path)
	if os.IsNotExist(err) {
		return nil
	}
	require.NoError(t, err)
	defer f.Close()
	var lines []map[string]any
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		var l map[string]any
		if json.Unmarshal(sc.Bytes(), &l) == nil && l["logger"] == "http.handlers.fair_queue" {
			lines = append(lines, l)
		}
	}
	require.NoError(t, sc.Err())
	return lines
}

// countLines counts the lines of level and msg.
func countLines(lines []map[string]any, level, msg string) int {
	n := 0
	for _, l := range lines {
		if l["level"] == level && l["msg"] == msg {
			n++
		}
	}
	return n
}

// docs/operations.md, "Log lines": through Caddy, with its log in a
// file, a Redis outage logs "store unreachable; applying on_store_error
// policy" at level error once per outage, however many requests the
// policy answers (three here, each 503 store_unavailable); Redis back
// (restarted empty) logs "store reachable again" (info) once, and "store
// lost its data; re-registered this node's permits" (warn) with the
// permits the instance held (a stream still running at the upstream),
// which Redis counts again. The first outage comes before the instance's
// first heartbeat (a poll_interval after its join, which the lease's
// third does not bring closer): Redis lost the data its first calls
// wrote all the same. A second outage logs its lines again. The
// instance's first request logs "node joined queue"; the exit, "node
// left queue".
func TestARedisOutageLogsItsLinesOncePerOutage(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	rds := redistest.Start(t)
	var arrivals atomic.Int32
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		arrivals.Add(1)
		if strings.Contains(r.URL.Path, "stream") {
			streamUntilGone(w, r)
			return
		}
		_, _ = io.WriteString(w, `{"ok":true}`)
	}))
	t.Cleanup(upstream.Close)

	logPath := filepath.Join(t.TempDir(), "caddy.log")
	port := freePort(t)
	const name = "outage-logs-once"
	config := fmt.Sprintf(`{"admin":{"disabled":true},"logging":{"logs":{
		"default":{"writer":{"output":"file","filename":%q},"encoder":{"format":"json"},"level":"INFO"}}},
	"apps":{"http":{"grace_period":"300ms","servers":{"s":{"listen":["127.0.0.1:%d"],"routes":[{"handle":[
	{"handler":"fair_queue","name":%q,"permits":2,"max_wait":"20s","poll_interval":"10s","lease":"60s","on_store_error":"fail_closed",
	 "redis":{"addresses":[%q]}},
	{"handler":"reverse_proxy","flush_interval":-1,"upstreams":[{"dial":%q}]}]}]}}}}}`,
		logPath, port, name, rds.Addr(), strings.TrimPrefix(upstream.URL, "http://"))
	require.NoError(t, caddy.Load([]byte(config), false))
	stopped := false
	t.Cleanup(func() {
		if !stopped {
			_ = caddy.Stop()
		}
	})
	base := fmt.Sprintf("http://127.0.0.1:%d", port)
	post := func(path string) (int, string) {
		resp, err := http.Post(base+path, "application/json", strings.NewReader(`{"messages":[]}`))
		require.NoError(t, err)
		_, _ = io.Copy(io.Discard, resp.Body)
		_ = resp.Body.Close()
		return resp.StatusCode, resp.Header.Get("Fair-Queue-Reason")
	}

	// A stream that holds its permit throughout.
	streamDone := make(chan struct{})
	streamCtx, endStream := context.WithCancel(context.Background())
	streamReq, err := http.NewRequestWithContext(streamCtx, http.MethodPost, base+"/stream", strings.NewReader(`{"messages":[]}`))
	require.NoError(t, err)
	t.Cleanup(func() { endStream(); <-streamDone }) // first: the upstream's Close waits for it
	go func() {
		defer close(streamDone)
		resp, err := http.DefaultClient.Do(streamReq)
		if err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			_ = resp.Body.Close()
		}
	}()
	require.Eventually(t, func() bool { return arrivals.Load() == 1 }, 10*time.Second, 5*time.Millisecond,
		"the stream reaches the upstream")
	code, _ := post("/plain")
	require.Equal(t, http.StatusOK, code)

	outage := func(n int) {
		rds.Kill()
		for i := range 3 {
			code, reason := post("/plain")
			assert.Equal(t, http.StatusServiceUnavailable, code, "outage %d, request %d", n, i)
			assert.Equal(t, "store_unavailable", reason, "outage %d, request %d", n, i)
		}
		rds.Restart() // empty: no persistence
		require.Eventually(t, func() bool {
			code, reason := post("/plain")
			return code == http.StatusOK && reason == ""
		}, 30*time.Second, 100*time.Millisecond, "outage %d: served again once Redis is back", n)
	}
	holders := func() int64 {
		n, err := rds.Client(t).ZCard(context.Background(), "{fair_queue:"+name+"}:holders").Result()
		require.NoError(t, err)
		return n
	}
	joined := time.Now()
	outage(1)
	require.Less(t, time.Since(joined), 10*time.Second, "the first outage ended after the first heartbeat was due")
	require.Eventually(t, func() bool { return holders() == 1 }, 30*time.Second, 50*time.Millisecond,
		"Redis counts the running stream's permit again")
	var lines []map[string]any
	require.Eventually(t, func() bool {
		lines = queueLogLines(t, logPath)
		return countLines(lines, "warn", "store lost its data; re-registered this node's permits") == 1
	}, 30*time.Second, 50*time.Millisecond, "the data loss is logged once Redis is back: %v", queueLogLines(t, logPath))
	assert.Equal(t, 1, countLines(lines, "info", "node joined queue"), "%v", lines)
	assert.Equal(t, 1, countLines(lines, "error", "store unreachable; applying on_store_error policy"),
		"the outage logged once, not per request: %v", lines)
	assert.Equal(t, 1, countLines(lines, "info", "store reachable again"), "%v", lines)
	for _, l := range lines {
		if l["msg"] == "store lost its data; re-registered this node's permits" {
			assert.Equal(t, 1.0, l["held"], "the permits this instance held at the restart: %v", l)
		}
		if n, ok := l["queue"]; ok {
			assert.Equal(t, name, n, "a queue's lines name it: %v", l)
		}
	}

	outage(2)
	require.Eventually(t, func() bool { return holders() == 1 }, 30*time.Second, 50*time.Millisecond,
		"Redis counts the running stream's permit again")
	require.Eventually(t, func() bool {
		lines = queueLogLines(t, logPath)
		return countLines(lines, "warn", "store lost its data; re-registered this node's permits") == 2
	}, 30*time.Second, 50*time.Millisecond, "the second data loss is logged: %v", queueLogLines(t, logPath))
	assert.Equal(t, 2, countLines(lines, "error", "store unreachable; applying on_store_error policy"),
		"each outage logged once: %v", lines)
	assert.Equal(t, 2, countLines(lines, "info", "store reachable again"), "%v", lines)

	endStream()
	<-streamDone
	stopped = true
	require.NoError(t, caddy.Stop())
	require.Eventually(t, func() bool {
		return countLines(queueLogLines(t, logPath), "info", "node left queue") == 1
	}, 30*time.Second, 50*time.Millisecond, "the exit logs the leave: %v", queueLogLines(t, logPath))
}
