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

// A reload that renames the queue, or drops the fair_queue route, leaves
// the old queue serving its waiters (operations.md: they stay in the old
// queue). Its handlers' servers were shut down for that reload, not for
// an exit: when the process then exits, nothing of the config in force
// names that queue, yet its waiters must be answered shutting_down at
// once like any other, not left waiting through the grace period (and
// cut without an answer when it ends).
func TestExitAnswersTheWaitersOfAQueueAReloadRetired(t *testing.T) {
	for _, tc := range []struct{ name, next string }{
		{"renamed", `{"handler":"fair_queue","name":"b","permits":1%s},`},
		{"route removed", ``},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Cleanup(func() { poolEmpty(t) })
			rds := redistest.Start(t)
			redis := fmt.Sprintf(`,"redis":{"addresses":[%q]}`, rds.Addr())

			var arrivals atomic.Int32
			held := make(chan struct{})
			upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				_, _ = io.Copy(io.Discard, r.Body)
				if arrivals.Add(1) == 1 {
					<-held // the first request holds the permit
				}
				w.WriteHeader(http.StatusOK)
			}))
			t.Cleanup(upstream.Close)
			t.Cleanup(func() { closeOnce(held) })

			t.Cleanup(func() { exitingForTest.Store(false) })
			port := freePort(t)
			config := func(queue string) string {
				return fmt.Sprintf(`{"admin":{"disabled":true},"logging":{"logs":{"default":{"level":"ERROR"}}},
				"apps":{"http":{"servers":{"s":{"listen":["127.0.0.1:%d"],"routes":[{"handle":[
				%s{"handler":"reverse_proxy","upstreams":[{"dial":%q}]}]}]}}}}}`,
					port, queue, strings.TrimPrefix(upstream.URL, "http://"))
			}
			old := fmt.Sprintf(`{"handler":"fair_queue","name":"a","permits":1,"max_wait":"60s"%s},`, redis)
			require.NoError(t, caddy.Load([]byte(config(old)), false))
			t.Cleanup(func() { _ = caddy.Stop() })

			url := fmt.Sprintf("http://127.0.0.1:%d/v1/chat/completions", port)
			type answer struct {
				code   int
				reason string
			}
			send := func() <-chan answer {
				ch := make(chan answer, 1)
				go func() {
					resp, err := http.Post(url, "application/json", strings.NewReader(`{"messages":[]}`))
					if err != nil {
						ch <- answer{reason: "error: " + err.Error()}
						return
					}
					defer resp.Body.Close()
					_, _ = io.Copy(io.Discard, resp.Body)
					ch <- answer{resp.StatusCode, resp.Header.Get("Fair-Queue-Reason")}
				}()
				return ch
			}
			running := send()
			require.Eventually(t, func() bool { return arrivals.Load() == 1 }, 10*time.Second, 5*time.Millisecond,
				"the first request reaches the upstream")
			waiter := send()
			waitingKey := "{fair_queue:a}:waiting"
			require.Eventually(t, func() bool {
				return len(rds.Keys(t, waitingKey)) == 1
			}, 10*time.Second, 5*time.Millisecond, "the second request waits in queue a")

			next := tc.next
			if next != "" {
				next = fmt.Sprintf(next, redis)
			}
			require.NoError(t, caddy.Load([]byte(config(next)), false))

			exitingForTest.Store(true) // the process exits (SIGTERM, caddy stop)
			stopped := make(chan error, 1)
			go func() { stopped <- caddy.Stop() }()

			select {
			case a := <-waiter:
				assert.Equal(t, http.StatusServiceUnavailable, a.code)
				assert.Equal(t, "shutting_down", a.reason)
			case <-time.After(10 * time.Second):
				t.Error("the waiter of the retired queue was not answered within 10s of the exit (max_wait 60s)")
			}
			closeOnce(held)
			select {
			case a := <-running:
				assert.Equal(t, http.StatusOK, a.code, "the running request finishes")
			case <-time.After(10 * time.Second):
				t.Error("the running request was not answered")
			}
			select {
			case <-stopped:
			case <-time.After(10 * time.Second):
				t.Error("caddy.Stop did not return")
			}
			assert.Eventually(t, func() bool { return len(rds.Keys(t, "{fair_queue:a}*")) == 0 }, 10*time.Second,
				10*time.Millisecond, "queue a's keys are left in Redis: %v", rds.Keys(t, "{fair_queue:a}*"))
			assert.Equal(t, int32(1), arrivals.Load(), "the waiter reached the upstream")
		})
	}
}
