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
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
	"github.com/fair-queue/caddy-fair-queue/fairqueue/redisstore"
	"github.com/fair-queue/caddy-fair-queue/internal/redistest"
)

// An instance that exits while one of its streams outlasts the grace
// period still runs that stream at the upstream until the process ends.
// Its permit must not go to another instance's waiter before the upstream
// has stopped the stream: the exit ends the instance's running requests
// first, holds each permit for its abort grace, and leaves only then.
// (Before, the leave released the permit while the stream still ran, and
// for that moment the upstream ran two requests under permits 1.) The
// test's process does not exit, so the stream would run on: the other
// instance, a Queue of the library on the same Redis queue, must be
// granted only once the upstream saw the stream end.
func TestExitEndsRunningStreamsBeforeAnotherInstanceGetsTheirPermits(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	rds := redistest.Start(t)

	var inFlight, arrivals atomic.Int32
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		inFlight.Add(1)
		defer inFlight.Add(-1)
		arrivals.Add(1)
		streamUntilGone(w, r)
	}))
	t.Cleanup(upstream.Close)

	t.Cleanup(func() { exitingForTest.Store(false) })
	port := freePort(t)
	config := fmt.Sprintf(`{"admin":{"disabled":true},"logging":{"logs":{"default":{"level":"ERROR"}}},
	"apps":{"http":{"grace_period":"300ms","servers":{"s":{"listen":["127.0.0.1:%d"],"routes":[{"handle":[
	{"handler":"fair_queue","name":"a","permits":1,"max_wait":"60s","abort_grace":"300ms","redis":{"addresses":[%q]}},
	{"handler":"reverse_proxy","flush_interval":-1,"upstreams":[{"dial":%q}]}]}]}}}}}`,
		port, rds.Addr(), strings.TrimPrefix(upstream.URL, "http://"))
	require.NoError(t, caddy.Load([]byte(config), false))
	t.Cleanup(func() { _ = caddy.Stop() })

	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	streamed := make(chan struct{})
	go func() {
		defer close(streamed)
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost,
			fmt.Sprintf("http://127.0.0.1:%d/v1/chat/completions", port),
			strings.NewReader(`{"stream":true,"messages":[]}`))
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			_ = resp.Body.Close()
		}
	}()
	require.Eventually(t, func() bool { return arrivals.Load() == 1 }, 10*time.Second, 5*time.Millisecond,
		"the stream reaches the upstream")

	// The other instance: the same Redis queue, through the library.
	exitGrantsTheOtherInstanceOnlyOnceTheStreamEnded(ctx, t, rds, &inFlight,
		"the other instance was granted the permit while the exiting instance's stream still ran at the upstream (permits 1)")
	cancel()
	<-streamed
}

// streamUntilGone answers an endless event stream until its client leaves.
func streamUntilGone(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "text/event-stream")
	w.WriteHeader(http.StatusOK)
	for {
		if _, err := io.WriteString(w, "data: {}\n\n"); err != nil {
			return
		}
		w.(http.Flusher).Flush()
		select {
		case <-r.Context().Done():
			return
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// exitGrantsTheOtherInstanceOnlyOnceTheStreamEnded queues a request of
// another instance (a Queue of the library on queue a of rds) behind the
// one streaming in the in-process Caddy, stops Caddy as the process's
// exit does, and asserts that the other instance is granted only once no
// stream runs at the upstream any more (inFlight, read at the grant).
func exitGrantsTheOtherInstanceOnlyOnceTheStreamEnded(ctx context.Context, t *testing.T,
	rds *redistest.Server, inFlight *atomic.Int32, msg string) {
	t.Helper()
	rdb := rds.Client(t)
	other, err := fairqueue.New(redisstore.New(rdb, "a", redisstore.Options{}),
		fairqueue.Config{Permits: 1, MaxWait: time.Minute})
	require.NoError(t, err)
	t.Cleanup(func() { _ = other.Close() })
	type grant struct {
		p        *fairqueue.Permit
		err      error
		inFlight int32
	}
	waiting := func() int64 {
		n, _ := rdb.ZCard(ctx, "{fair_queue:a}:waiting").Result()
		return n
	}
	before := waiting() // a request of the exiting instance, if one waits
	granted := make(chan grant, 1)
	go func() {
		p, err := other.Acquire(ctx, fairqueue.Request{})
		granted <- grant{p, err, inFlight.Load()}
	}()
	require.Eventually(t, func() bool { return waiting() == before+1 }, 10*time.Second, 5*time.Millisecond,
		"the other instance's request waits")

	exitingForTest.Store(true) // the process exits (SIGTERM, caddy stop)
	stopped := make(chan error, 1)
	go func() { stopped <- caddy.Stop() }()

	select {
	case g := <-granted:
		require.NoError(t, g.err)
		t.Cleanup(g.p.Release)
		assert.Zero(t, g.inFlight, msg)
	case <-time.After(30 * time.Second):
		t.Fatal("the other instance's waiter was not granted within 30s of the exit")
	}
	select {
	case <-stopped:
	case <-time.After(30 * time.Second):
		t.Error("caddy.Stop did not return")
	}
}
