package caddyfairqueue

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A client that leaves while its request waits is logged as
// reverse_proxy logs a client that leaves while it runs: status 499
// (client closed request), not a 200 that was never sent.
func TestAccessLogRecordsAClientThatLeftWhileWaitingAs499(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	release := make(chan struct{})
	var arrived atomic.Int32
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		arrived.Add(1)
		<-release
		_, _ = io.WriteString(w, "ok")
	}))
	t.Cleanup(up.Close)
	var once bool
	t.Cleanup(func() {
		if !once {
			close(release)
		}
	})

	logPath := filepath.Join(t.TempDir(), "access.log")
	port := freePort(t)
	const name = "access-log-left"
	cfg := fmt.Sprintf(`{"admin":{"disabled":true},"logging":{"logs":{
		"default":{"level":"ERROR","exclude":["http.log.access"]},
		"access":{"writer":{"output":"file","filename":%q},"encoder":{"format":"json"},"include":["http.log.access"]}}},
	"apps":{"http":{"servers":{"s":{"listen":["127.0.0.1:%d"],"logs":{},"routes":[{"handle":[
		{"handler":"fair_queue","name":%q,"permits":1,"max_wait":"30s"},
		{"handler":"reverse_proxy","upstreams":[{"dial":%q}]}]}]}}}}}`,
		logPath, port, name, strings.TrimPrefix(up.URL, "http://"))
	require.NoError(t, caddy.Load([]byte(cfg), false))
	t.Cleanup(func() { _ = caddy.Stop() })
	url := fmt.Sprintf("http://127.0.0.1:%d/v1/chat/completions", port)
	body := `{"model":"m","messages":[]}`

	held := make(chan int, 1)
	go func() {
		resp, err := http.Post(url, "application/json", strings.NewReader(body))
		if err != nil {
			held <- 0
			return
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		held <- resp.StatusCode
	}()
	require.Eventually(t, func() bool { return arrived.Load() == 1 }, 10*time.Second, 5*time.Millisecond)

	ctx, cancel := context.WithCancel(context.Background())
	left := make(chan error, 1)
	go func() {
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			resp.Body.Close()
		}
		left <- err
	}()
	require.Eventually(t, func() bool { return queueWaiting(t, name) == 1 }, 10*time.Second, 5*time.Millisecond)
	cancel()
	require.Error(t, <-left)
	require.Eventually(t, func() bool { return queueWaiting(t, name) == 0 }, 10*time.Second, 5*time.Millisecond)
	once = true
	close(release)
	require.Equal(t, http.StatusOK, <-held)

	var entries []map[string]any
	require.Eventually(t, func() bool { entries = accessLogEntries(t, logPath); return len(entries) == 2 },
		10*time.Second, 20*time.Millisecond, "the access log holds %d entries, want 2", len(entries))
	byOutcome := make(map[string]float64)
	for _, e := range entries {
		fq, ok := e["fair_queue"].(map[string]any)
		require.True(t, ok, "no fair_queue object in %v", e)
		outcome, _ := fq["outcome"].(string)
		status, _ := e["status"].(float64)
		byOutcome[outcome] = status
	}
	assert.Equal(t, map[string]float64{"granted": 200, "cancelled": 499}, byOutcome)
}
