package caddyfairqueue

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/internal/redistest"
)

// Names that differ only where one has a brace and the other an
// underscore ("x{", "x}", "x_") are one queue in Redis: a brace in a key's
// tag would change its hash tag, so the store replaces it. Their queues,
// open together and given back once idle, leave nothing in Redis: the
// last one's leave deletes the queue's keys and takes it out of the
// registry of queues, whichever name it has. A client sending such names
// must not grow the registry for good.
func TestNamesOfOneRedisQueueLeaveNothingInTheRegistry(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	setQueueIdle(t, 20*time.Millisecond)
	rds := redistest.Start(t)
	hold := make(chan struct{})
	var arrivals atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		arrivals.Add(1)
		<-hold
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"choices":[]}`)
	}))
	t.Cleanup(srv.Close)
	up := strings.TrimPrefix(srv.URL, "http://")
	port := freePort(t)
	config := fmt.Sprintf(`{"admin":{"disabled":true},"apps":{"http":{"servers":{"s":{"listen":["127.0.0.1:%d"],"routes":[{"handle":[
		{"handler":"fair_queue","name":"{http.request.header.X-Model}","permits":1,"max_wait":"30s","redis":{"addresses":[%q]}},
		{"handler":"reverse_proxy","upstreams":[{"dial":%q}]}]}]}}}}}`, port, rds.Addr(), up)
	require.NoError(t, caddy.Load([]byte(config), false))
	t.Cleanup(func() { _ = caddy.Stop() })

	names := []string{"x{", "x}", "x_"}
	var wg sync.WaitGroup
	codes := make(chan int, len(names))
	for _, n := range names {
		wg.Go(func() {
			req, err := http.NewRequest(http.MethodPost, fmt.Sprintf("http://127.0.0.1:%d/v1/chat/completions", port), strings.NewReader(`{"messages":[]}`))
			if !assert.NoError(t, err) {
				return
			}
			req.Header.Set("X-Model", n)
			resp, err := http.DefaultClient.Do(req)
			if !assert.NoError(t, err) {
				return
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			codes <- resp.StatusCode
		})
	}
	// The three queues are open at once: one request runs, the others
	// wait for the one permit of their common Redis queue.
	require.Eventually(t, func() bool { return len(namesakes.all()) == len(names) && arrivals.Load() >= 1 },
		10*time.Second, 5*time.Millisecond, "the three queues open")
	require.Eventually(t, func() bool { return len(rds.Keys(t, "{fair_queue}:queues")) == 1 },
		10*time.Second, 5*time.Millisecond, "the queues named in the registry")
	close(hold)
	wg.Wait()
	close(codes)
	for code := range codes {
		assert.Equal(t, http.StatusOK, code)
	}
	require.Eventually(t, func() bool { return len(namesakes.all()) == 0 }, 10*time.Second, 5*time.Millisecond,
		"the idle queues given back")
	assert.Eventually(t, func() bool { return len(rds.Keys(t, "*")) == 0 }, 5*time.Second, 10*time.Millisecond,
		"keys left in Redis once every queue was given back")
	members, err := rds.Client(t).ZRange(t.Context(), "{fair_queue}:queues", 0, -1).Result()
	require.NoError(t, err)
	assert.Empty(t, members, "names left in the registry of queues")
}
