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

// A config load that fails still provisions the fair_queue handlers
// before the module that fails: a queue one of them names statically is
// opened then, with that config's settings. The config in force may
// name the same queue from the request (placeholders) and send it a
// request meanwhile: its settings are the ones in force, and must stay
// so once the failed config is gone, not the failed config's.
func TestAFailedReloadLeavesTheRunningConfigsSettingsOnAQueueItOpened(t *testing.T) {
	for _, store := range []string{"local", "redis"} {
		t.Run(store, func(t *testing.T) {
			t.Cleanup(func() { poolEmpty(t) })
			redis := ""
			if store == "redis" {
				redis = fmt.Sprintf(`,"redis":{"addresses":[%q]}`, redistest.Start(t).Addr())
			}
			stall.entered, stall.release = make(chan struct{}, 1), make(chan struct{})

			var arrivals atomic.Int32
			held := make(chan struct{})
			upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				_, _ = io.Copy(io.Discard, r.Body)
				if arrivals.Add(1) == 1 {
					<-held // the first request holds its permit
				}
				w.WriteHeader(http.StatusOK)
			}))
			t.Cleanup(upstream.Close)
			t.Cleanup(func() { closeOnce(held) })

			port := freePort(t)
			running := fmt.Sprintf(`{"admin":{"disabled":true},"logging":{"logs":{"default":{"level":"ERROR"}}},
			"apps":{"http":{"servers":{"s":{"listen":["127.0.0.1:%d"],"routes":[{"handle":[
			{"handler":"fair_queue","name":"{http.request.header.X-Model}","permits":1,"max_wait":"2s"%s},
			{"handler":"reverse_proxy","upstreams":[{"dial":%q}]}]}]}}}}}`,
				port, redis, strings.TrimPrefix(upstream.URL, "http://"))
			require.NoError(t, caddy.Load([]byte(running), false))
			t.Cleanup(func() { _ = caddy.Stop() })

			failing := fmt.Sprintf(`{"admin":{"disabled":true},"logging":{"logs":{"default":{"level":"ERROR"}}},
			"apps":{"http":{"servers":{"s":{"listen":["127.0.0.1:%d"],"routes":[{"handle":[
			{"handler":"fair_queue","name":"llama","permits":5%s},
			{"handler":"fair_queue_test_stall"}]}]}}}}}`, port, redis)
			loaded := make(chan error, 1)
			go func() { loaded <- caddy.Load([]byte(failing), false) }()
			select {
			case <-stall.entered:
			case <-time.After(10 * time.Second):
				t.Fatal("the failing config's stalling module was not provisioned")
			}

			url := fmt.Sprintf("http://127.0.0.1:%d/v1/chat/completions", port)
			send := func() (int, string) {
				req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(`{"messages":[]}`))
				require.NoError(t, err)
				req.Header.Set("X-Model", "llama")
				resp, err := http.DefaultClient.Do(req)
				require.NoError(t, err)
				defer resp.Body.Close()
				_, _ = io.Copy(io.Discard, resp.Body)
				return resp.StatusCode, resp.Header.Get("Fair-Queue-Reason")
			}
			first := make(chan int, 1)
			go func() { code, _ := send(); first <- code }()
			require.Eventually(t, func() bool { return arrivals.Load() == 1 }, 10*time.Second, 5*time.Millisecond,
				"the running config's first request reaches the upstream")

			close(stall.release)
			select {
			case err := <-loaded:
				require.Error(t, err, "the second config fails to load")
			case <-time.After(10 * time.Second):
				t.Fatal("the failing load did not return")
			}

			code, reason := send()
			assert.Equal(t, "timeout", reason, "with the running config's 1 permit held, the second request waits and times out (status %d, %d upstream arrivals)", code, arrivals.Load())
			assert.EqualValues(t, 1, arrivals.Load(), "the upstream never runs more than the running config's permits")

			closeOnce(held)
			select {
			case code := <-first:
				assert.Equal(t, http.StatusOK, code)
			case <-time.After(10 * time.Second):
				t.Fatal("the first request was not answered")
			}
		})
	}
}

// A config whose load fails once its http app has started (another app
// fails to start; Caddy then stops the http app) serves requests for
// that moment, and its fair_queue applies its settings to the queue it
// shares with the config in force. Once it is gone, the config in force
// serves on: its settings must be the queue's again, not the failed
// config's.
func TestAConfigThatFailsToStartLeavesTheRunningConfigsSettings(t *testing.T) {
	for _, store := range []string{"local", "redis"} {
		t.Run(store, func(t *testing.T) {
			t.Cleanup(func() { poolEmpty(t) })
			redis := ""
			if store == "redis" {
				redis = fmt.Sprintf(`,"redis":{"addresses":[%q]}`, redistest.Start(t).Addr())
			}
			var arrivals atomic.Int32
			var holdNext atomic.Bool
			held := make(chan struct{})
			upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				_, _ = io.Copy(io.Discard, r.Body)
				arrivals.Add(1)
				if holdNext.CompareAndSwap(true, false) {
					<-held // the failing config's request holds its permit
				}
				w.WriteHeader(http.StatusOK)
			}))
			t.Cleanup(upstream.Close)
			t.Cleanup(func() { closeOnce(held) })
			dial := strings.TrimPrefix(upstream.URL, "http://")

			config := func(port, permits int, app string) string {
				return fmt.Sprintf(`{"admin":{"disabled":true},"logging":{"logs":{"default":{"level":"ERROR"}}},
				"apps":{%s"http":{"servers":{"s":{"listen":["127.0.0.1:%d"],"routes":[{"handle":[
				{"handler":"fair_queue","name":"failstart","permits":%d,"max_wait":"2s"%s},
				{"handler":"reverse_proxy","upstreams":[{"dial":%q}]}]}]}}}}}`, app, port, permits, redis, dial)
			}
			port := freePort(t)
			require.NoError(t, caddy.Load([]byte(config(port, 1, "")), false))
			t.Cleanup(func() { _ = caddy.Stop() })
			send := func(port int) (int, string) {
				resp, err := http.Post(fmt.Sprintf("http://127.0.0.1:%d/v1/chat/completions", port), "application/json", strings.NewReader(`{"messages":[]}`))
				require.NoError(t, err)
				defer resp.Body.Close()
				_, _ = io.Copy(io.Discard, resp.Body)
				return resp.StatusCode, resp.Header.Get("Fair-Queue-Reason")
			}
			code, reason := send(port)
			require.Equal(t, http.StatusOK, code, "the running config serves (its settings applied); reason %q", reason)
			arrivals.Store(0)

			// The failing config serves on a port of its own, so that a
			// request reaches it and not the config in force.
			other := freePort(t)
			failing.release = make(chan struct{})
			loaded := loadFailing(t, config(other, 5, failStartApp(other)))

			holdNext.Store(true)
			first := make(chan int, 1)
			go func() { code, _ := send(other); first <- code }()
			require.Eventually(t, func() bool { return arrivals.Load() == 1 }, 10*time.Second, 5*time.Millisecond,
				"the failing config's request reaches the upstream")
			close(failing.release)
			select {
			case err := <-loaded:
				require.Error(t, err, "the second config fails to start")
			case <-time.After(10 * time.Second):
				t.Fatal("the failing load did not return")
			}

			code, reason = send(port)
			assert.Equal(t, "timeout", reason, "with the running config's 1 permit held, its next request waits and times out (status %d, %d upstream arrivals)", code, arrivals.Load())
			assert.EqualValues(t, 1, arrivals.Load(), "the upstream never runs more than the running config's permits")

			closeOnce(held)
			select {
			case code := <-first:
				assert.Equal(t, http.StatusOK, code)
			case <-time.After(10 * time.Second):
				t.Fatal("the failing config's request was not answered")
			}
		})
	}
}

// closeOnce closes ch unless it is closed.
func closeOnce(ch chan struct{}) {
	select {
	case <-ch:
	default:
		close(ch)
	}
}
