package caddyfairqueue

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/internal/redistest"
)

// A request granted on a local queue's pool, refused by its upstream
// (requeue_on) and moved by a reload to the Redis queue of the same name
// while it waited again, runs under a Redis permit once granted there. The
// exit must end it before the queue leaves Redis, as it ends the requests
// forwarded on a Redis queue from the start: else another instance is
// granted its permit while it still runs at the upstream.
func TestExitEndsARequestMovedToRedisWhileRequeuedBeforeAnotherInstanceGetsItsPermit(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	rds := redistest.Start(t)

	var inFlight, arrivals atomic.Int32
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		if r.Header.Get("X-Quick") != "" {
			w.WriteHeader(http.StatusOK)
			return
		}
		if arrivals.Add(1) == 1 {
			// The local pool's only upstream refuses, and cools a minute.
			w.Header().Set("Retry-After", "60")
			w.WriteHeader(http.StatusTooManyRequests)
			return
		}
		inFlight.Add(1)
		defer inFlight.Add(-1)
		streamUntilGone(w, r)
	}))
	t.Cleanup(upstream.Close)
	dial := strings.TrimPrefix(upstream.URL, "http://")

	t.Cleanup(func() { exitingForTest.Store(false) })
	port := freePort(t)
	config := func(handle string) string {
		return fmt.Sprintf(`{"admin":{"disabled":true},"logging":{"logs":{"default":{"level":"ERROR"}}},
		"apps":{"http":{"grace_period":"300ms","servers":{"s":{"listen":["127.0.0.1:%d"],"routes":[{"handle":[%s]}]}}}}}`,
			port, handle)
	}
	local := fmt.Sprintf(`{"handler":"fair_queue","name":"a","upstreams":[{"dial":%q,"permits":1}],"requeue_on":[429],
		"max_wait":"60s","abort_grace":"300ms"},
		{"handler":"fair_queue_test_late_eof"},
		{"handler":"reverse_proxy","flush_interval":-1,"dynamic_upstreams":{"source":"fair_queue"}}`, dial)
	remote := fmt.Sprintf(`{"handler":"fair_queue","name":"a","permits":1,"max_wait":"60s","abort_grace":"300ms",
		"redis":{"addresses":[%q]}},
		{"handler":"reverse_proxy","flush_interval":-1,"upstreams":[{"dial":%q}]}`, rds.Addr(), dial)
	require.NoError(t, caddy.Load([]byte(config(local)), false))
	t.Cleanup(func() { _ = caddy.Stop() })
	url := fmt.Sprintf("http://127.0.0.1:%d/v1/chat/completions", port)

	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	streamed := make(chan struct{})
	go func() {
		defer close(streamed)
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(`{"stream":true,"messages":[]}`))
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			_ = resp.Body.Close()
		}
	}()
	require.Eventually(t, func() bool { return arrivals.Load() == 1 }, 10*time.Second, 5*time.Millisecond,
		"the request reaches the local pool's upstream, which refuses it")
	time.Sleep(200 * time.Millisecond) // it waits again, its upstream cooling

	// The reload keeps queue a in Redis; the new config's first request
	// records its route, and the requeued request moves there.
	reload(t, config(remote))
	// It may be granted before the moved request or wait behind it (the
	// moved request's stream never ends): either is right, and at the exit
	// a waiting one is answered or served before the other instance.
	go func() {
		quick, _ := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(`{"messages":[]}`))
		quick.Header.Set("X-Quick", "1")
		if resp, err := http.DefaultClient.Do(quick); err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			_ = resp.Body.Close()
		}
	}()
	require.Eventually(t, func() bool { return inFlight.Load() == 1 }, 20*time.Second, 5*time.Millisecond,
		"the moved request is granted in Redis and sent again")

	// The other instance: the same Redis queue, through the library.
	exitGrantsTheOtherInstanceOnlyOnceTheStreamEnded(ctx, t, rds, &inFlight,
		"the other instance was granted the permit while the moved request still ran at the upstream (permits 1)")
	cancel()
	<-streamed
}
