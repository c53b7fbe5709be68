package caddyfairqueue

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/internal/redistest"
)

// As TestAConfigThatFailsToStartLeavesTheRunningConfigsSettings, with the
// queue named from the request: the failing config serves it for a
// moment and gives its reference up once the queue has been idle
// (queueIdle) before the load fails. Its settings, applied last, must
// not stay in force on the queue the running config still serves.
func TestAFailedConfigsIdleQueueGetsTheRunningConfigsSettingsBack(t *testing.T) {
	for _, store := range []string{"local", "redis"} {
		t.Run(store, func(t *testing.T) {
			t.Cleanup(func() { poolEmpty(t) })
			setQueueIdle(t, 50*time.Millisecond)
			redis := ""
			if store == "redis" {
				redis = fmt.Sprintf(`,"redis":{"addresses":[%q]}`, redistest.Start(t).Addr())
			}
			var arrivals atomic.Int32
			held := make(chan struct{})
			upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				_, _ = io.Copy(io.Discard, r.Body)
				if arrivals.Add(1) == 1 {
					<-held // the running config's first request holds its permit
				}
				w.WriteHeader(http.StatusOK)
			}))
			t.Cleanup(upstream.Close)
			t.Cleanup(func() { closeOnce(held) })
			dial := strings.TrimPrefix(upstream.URL, "http://")

			config := func(port, permits int, app string) string {
				return fmt.Sprintf(`{"admin":{"disabled":true},"logging":{"logs":{"default":{"level":"ERROR"}}},
				"apps":{%s"http":{"servers":{"s":{"listen":["127.0.0.1:%d"],"routes":[{"handle":[
				{"handler":"fair_queue","name":"{http.request.header.X-Model}","permits":%d,"max_wait":"2s"%s},
				{"handler":"reverse_proxy","upstreams":[{"dial":%q}]}]}]}}}}}`, app, port, permits, redis, dial)
			}
			port := freePort(t)
			require.NoError(t, caddy.Load([]byte(config(port, 1, "")), false))
			t.Cleanup(func() { _ = caddy.Stop() })
			send := func(port int) (int, string) {
				req, err := http.NewRequest(http.MethodPost, fmt.Sprintf("http://127.0.0.1:%d/v1/chat/completions", port), strings.NewReader(`{"messages":[]}`))
				require.NoError(t, err)
				req.Header.Set("X-Model", "idle")
				resp, err := http.DefaultClient.Do(req)
				require.NoError(t, err)
				defer resp.Body.Close()
				_, _ = io.Copy(io.Discard, resp.Body)
				return resp.StatusCode, resp.Header.Get("Fair-Queue-Reason")
			}
			first := make(chan int, 1)
			go func() { code, _ := send(port); first <- code }()
			require.Eventually(t, func() bool { return arrivals.Load() == 1 }, 10*time.Second, 5*time.Millisecond,
				"the running config's first request reaches the upstream")

			// The failing config serves on a port of its own.
			other := freePort(t)
			failing.release = make(chan struct{})
			loaded := loadFailing(t, config(other, 5, failStartApp(other)))

			// Its request runs beside the running config's (its 5 permits
			// applied), ends, and its queue goes idle: its handler gives
			// the reference up.
			code, reason := send(other)
			require.Equal(t, http.StatusOK, code, "the failing config serves its request (reason %q)", reason)
			require.Eventually(t, func() bool { return appliersOf("idle") == 1 }, 10*time.Second, 5*time.Millisecond,
				"the failing config's handler drops its idle queue")

			close(failing.release)
			select {
			case err := <-loaded:
				require.Error(t, err, "the second config fails to start")
			case <-time.After(10 * time.Second):
				t.Fatal("the failing load did not return")
			}

			code, reason = send(port)
			assert.Equal(t, "timeout", reason, "with the running config's 1 permit held, its next request waits and times out (status %d, %d upstream arrivals)", code, arrivals.Load())
			assert.EqualValues(t, 2, arrivals.Load(), "the upstream never runs more than the running config's permits once the failed config is gone")

			closeOnce(held)
			select {
			case code := <-first:
				assert.Equal(t, http.StatusOK, code)
			case <-time.After(10 * time.Second):
				t.Fatal("the running config's first request was not answered")
			}
		})
	}
}

// appliersOf is the number of handlers holding a reference to the open
// engine of queue name that applied their settings to it.
func appliersOf(name string) int {
	for _, e := range openEngines() {
		if e.name == name {
			e.appliers.mu.Lock()
			n := len(e.appliers.m)
			e.appliers.mu.Unlock()
			return n
		}
	}
	return -1
}
