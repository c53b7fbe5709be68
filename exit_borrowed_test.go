package caddyfairqueue

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
	"github.com/fair-queue/caddy-fair-queue/fairqueue/redisstore"
	"github.com/fair-queue/caddy-fair-queue/internal/redistest"
)

// A request that reaches the old config's handler after a reload (its
// body still arriving as the reload ran) borrows its queue for itself,
// whether or not the config in force still names it. When the process
// then exits while it waits there, it is answered shutting_down at once
// like any other waiter, not left waiting until max_wait (the exit waits
// for the old server's requests through the grace period).
func TestExitAnswersAWaiterThatReachedTheOldHandlerAfterAReload(t *testing.T) {
	for _, tc := range []struct{ name, next string }{
		{"renamed", "b"},
		{"kept", "a"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Cleanup(func() { poolEmpty(t) })
			rds := redistest.Start(t)
			upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				_, _ = io.Copy(io.Discard, r.Body)
				w.WriteHeader(http.StatusOK)
			}))
			t.Cleanup(upstream.Close)

			// Another instance holds queue a's only permit.
			ctx, cancel := context.WithCancel(context.Background())
			t.Cleanup(cancel)
			rdb := rds.Client(t)
			other, err := fairqueue.New(redisstore.New(rdb, "a", redisstore.Options{}),
				fairqueue.Config{Permits: 1, MaxWait: time.Minute})
			require.NoError(t, err)
			t.Cleanup(func() { _ = other.Close() })
			held, err := other.Acquire(ctx, fairqueue.Request{})
			require.NoError(t, err)
			t.Cleanup(held.Release)

			t.Cleanup(func() { exitingForTest.Store(false) })
			port := freePort(t)
			config := func(queue, maxWait string) string {
				return fmt.Sprintf(`{"admin":{"disabled":true},"logging":{"logs":{"default":{"level":"ERROR"}}},
				"apps":{"http":{"grace_period":"60s","servers":{"s":{"listen":["127.0.0.1:%d"],"routes":[{"handle":[
				{"handler":"fair_queue","name":%q,"permits":1,"max_wait":%q,"redis":{"addresses":[%q]}},
				{"handler":"reverse_proxy","upstreams":[{"dial":%q}]}]}]}}}}}`,
					port, queue, maxWait, rds.Addr(), strings.TrimPrefix(upstream.URL, "http://"))
			}
			require.NoError(t, caddy.Load([]byte(config("a", "60s")), false))
			t.Cleanup(func() { _ = caddy.Stop() })

			type answer struct {
				code   int
				reason string
			}
			answered := make(chan answer, 1)
			body, send := io.Pipe()
			t.Cleanup(func() { _ = send.Close() })
			go func() {
				req, _ := http.NewRequestWithContext(ctx, http.MethodPost,
					fmt.Sprintf("http://127.0.0.1:%d/v1/chat/completions", port), body)
				resp, err := http.DefaultClient.Do(req)
				if err != nil {
					answered <- answer{reason: "error: " + err.Error()}
					return
				}
				defer resp.Body.Close()
				_, _ = io.Copy(io.Discard, resp.Body)
				answered <- answer{resp.StatusCode, resp.Header.Get("Fair-Queue-Reason")}
			}()
			// The body begins: the old config's handler has the request.
			_, err = io.WriteString(send, `{"messages":[`)
			require.NoError(t, err)
			time.Sleep(time.Second) // the server has read its header

			// Another max_wait: a reload even where the queue is kept.
			require.NoError(t, caddy.Load([]byte(config(tc.next, "59s")), false))
			_, err = io.WriteString(send, `]}`)
			require.NoError(t, err)
			require.NoError(t, send.Close())
			require.Eventually(t, func() bool {
				n, _ := rdb.ZCard(ctx, "{fair_queue:a}:waiting").Result()
				return n == 1
			}, 10*time.Second, 5*time.Millisecond, "the request waits in queue a")

			exitingForTest.Store(true) // the process exits (SIGTERM, caddy stop)
			stopped := make(chan error, 1)
			go func() { stopped <- caddy.Stop() }()

			select {
			case a := <-answered:
				assert.Equal(t, http.StatusServiceUnavailable, a.code, "reason %q", a.reason)
				assert.Equal(t, "shutting_down", a.reason)
			case <-time.After(10 * time.Second):
				t.Error("the waiter was not answered within 10s of the exit (max_wait 60s)")
			}
			held.Release() // the waiter, if it still waits, is served
			select {
			case <-stopped:
			case <-time.After(30 * time.Second):
				t.Error("caddy.Stop did not return")
			}
		})
	}
}
