package caddyfairqueue

import (
	"context"
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
)

// The handler whose settings a reload's cleanup hands on is not always
// the one whose route the old waiters take: a handler that applied its
// settings at another's cleanup never served, so the waiters of the
// config before it still run on their own route; and a config with two
// handlers of the queue has waiters on both routes. Handing on more
// permits by the chain of the handler cleaned up must not run those
// routes' upstreams above the permits they were given.

// peakUpstream is an upstream that holds every request until released and
// records the most it ran at once.
type peakUpstream struct {
	srv     *httptest.Server
	now     atomic.Int32
	most    atomic.Int32
	release chan struct{}
	once    sync.Once
}

// newPeakUpstream starts a peakUpstream; it is released and closed with the test.
func newPeakUpstream(t *testing.T) *peakUpstream {
	t.Helper()
	g := &peakUpstream{release: make(chan struct{})}
	g.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		n := g.now.Add(1)
		for {
			m := g.most.Load()
			if n <= m || g.most.CompareAndSwap(m, n) {
				break
			}
		}
		<-g.release
		g.now.Add(-1)
		w.WriteHeader(http.StatusOK)
	}))
	t.Cleanup(g.srv.Close)
	t.Cleanup(g.open)
	return g
}

// open releases every request, now and later.
func (g *peakUpstream) open() { g.once.Do(func() { close(g.release) }) }

// dial is the upstream's address for reverse_proxy.
func (g *peakUpstream) dial() string { return strings.TrimPrefix(g.srv.URL, "http://") }

// olderConfig is a config whose fair_queue handlers of queue "older",
// permits each, go to the upstreams (one route each, by path).
func olderConfig(port, permits int, upstreams ...*peakUpstream) string {
	var routes []string
	for i, u := range upstreams {
		routes = append(routes, fmt.Sprintf(`{"match":[{"path":["/%d"]}],"handle":[
			{"handler":"fair_queue","name":"older","permits":%d,"max_wait":"1m"},
			{"handler":"reverse_proxy","upstreams":[{"dial":%q}]}]}`, i, permits, u.dial()))
	}
	return fmt.Sprintf(`{"admin":{"disabled":true},"logging":{"logs":{"default":{"level":"ERROR"}}},
	"apps":{"http":{"servers":{"s":{"listen":["127.0.0.1:%d"],"routes":[%s]}}}}}`, port, strings.Join(routes, ","))
}

// olderPoolConfig is a config whose one route (/0) gives queue "older" a
// pool of upstream u with permits.
func olderPoolConfig(port, permits int, u *peakUpstream) string {
	return fmt.Sprintf(`{"admin":{"disabled":true},"logging":{"logs":{"default":{"level":"ERROR"}}},
	"apps":{"http":{"servers":{"s":{"listen":["127.0.0.1:%d"],"routes":[{"match":[{"path":["/0"]}],"handle":[
		{"handler":"fair_queue","name":"older","upstreams":[{"dial":%q,"permits":%d}],"max_wait":"1m"},
		{"handler":"reverse_proxy","dynamic_upstreams":{"source":"fair_queue"}}]}]}}}}}`, port, u.dial(), permits)
}

// holdAndQueue loads config, the first config, whose route /0 runs on
// a, and sends one request that holds a and n that wait behind it; it
// returns the channels of their answers' statuses.
func holdAndQueue(t *testing.T, port int, config string, a *peakUpstream, n int) (onA, waiters <-chan int) {
	t.Helper()
	require.NoError(t, caddy.Load([]byte(config), false))
	t.Cleanup(func() { _ = caddy.Stop() })
	onA = sendOlder(t, port, "/0", 1)
	require.Eventually(t, func() bool { return a.now.Load() == 1 }, 10*time.Second, 5*time.Millisecond,
		"the first config's holder on A")
	waiters = sendOlder(t, port, "/0", n)
	require.Eventually(t, func() bool { return olderWaiting() == n }, 10*time.Second, 5*time.Millisecond)
	return onA, waiters
}

// olderWaiting is how many wait in queue "older".
func olderWaiting() int {
	for _, e := range openEngines() {
		if e.name == "older" {
			if snap, err := e.q.Inspect(context.Background(), 0, 0); err == nil {
				return snap.Waiting
			}
		}
	}
	return -1
}

// sendOlder sends n requests to path on port; their answers' statuses
// come on the channel returned.
func sendOlder(t *testing.T, port int, path string, n int) <-chan int {
	t.Helper()
	codes := make(chan int, n)
	for range n {
		go func() {
			resp, err := http.Post(fmt.Sprintf("http://127.0.0.1:%d%s", port, path), "application/json",
				strings.NewReader(`{"messages":[]}`))
			if err != nil {
				codes <- 0
				return
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			_ = resp.Body.Close()
			codes <- resp.StatusCode
		}()
	}
	return codes
}

// A waiter of the first config (1 permit, upstream A) outlives two
// reloads: the first points the route at B with the same permit, the
// second raises B's permits to 3. The second handler, whose settings the
// first reload handed on, never served: the first config's waiters still
// run on A, which must not run three of them.
func TestHandingOnMorePermitsKeepsTheWaitersOfAnOlderConfigWithinTheirUpstreamsPermits(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	a, b := newPeakUpstream(t), newPeakUpstream(t)
	port := freePort(t)
	require.NoError(t, caddy.Load([]byte(olderConfig(port, 1, a)), false))
	t.Cleanup(func() { _ = caddy.Stop() })
	codes := sendOlder(t, port, "/0", 4)
	require.Eventually(t, func() bool { return a.now.Load() == 1 && olderWaiting() == 3 }, 10*time.Second,
		5*time.Millisecond, "one request on A, three waiting")

	require.NoError(t, caddy.Load([]byte(olderConfig(port, 1, b)), false))
	require.NoError(t, caddy.Load([]byte(olderConfig(port, 3, b)), false))
	time.Sleep(500 * time.Millisecond) // time for waiters granted to reach A
	assert.Equal(t, int32(1), a.most.Load(), "A ran more at once than its 1 permit")

	a.open()
	b.open()
	for range 4 {
		assert.Equal(t, http.StatusOK, <-codes)
	}
}

// The old config has two routes of the queue, to A and to B, sharing 1
// permit; the new one keeps B's route alone with 3 permits. The handler
// whose settings were in force may be B's: the waiters of A's route
// still run on A, which must not run three of them.
func TestHandingOnMorePermitsKeepsTheWaitersOfAnotherRouteWithinTheirUpstreamsPermits(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	a, b := newPeakUpstream(t), newPeakUpstream(t)
	port := freePort(t)
	require.NoError(t, caddy.Load([]byte(olderConfig(port, 1, a, b)), false))
	t.Cleanup(func() { _ = caddy.Stop() })
	onB := sendOlder(t, port, "/1", 1) // B's handler applies its settings: the newer of the two
	require.Eventually(t, func() bool { return b.now.Load() == 1 }, 10*time.Second, 5*time.Millisecond)
	onA := sendOlder(t, port, "/0", 3)
	require.Eventually(t, func() bool { return olderWaiting() == 3 }, 10*time.Second, 5*time.Millisecond)

	// The new config: B's route alone (the path of its route is /1 still).
	next := strings.Replace(olderConfig(port, 3, a, b), fmt.Sprintf(`{"match":[{"path":["/0"]}],"handle":[
			{"handler":"fair_queue","name":"older","permits":3,"max_wait":"1m"},
			{"handler":"reverse_proxy","upstreams":[{"dial":%q}]}]},`, a.dial()), "", 1)
	require.NotEqual(t, olderConfig(port, 3, a, b), next)
	require.NoError(t, caddy.Load([]byte(next), false))
	time.Sleep(500 * time.Millisecond) // time for waiters granted to reach A
	assert.LessOrEqual(t, a.most.Load(), int32(1), "A ran more at once than the 1 permit of its route")

	a.open()
	b.open()
	assert.Equal(t, http.StatusOK, <-onB)
	for range 3 {
		assert.Equal(t, http.StatusOK, <-onA)
	}
}

// As above, but B's route served the queue last: the new config's B
// route takes over for the waiters of A's route, which the 3 permits
// grant on B, and A still runs no more than its 1.
func TestHandingOnMorePermitsSendsTheWaitersOfAnotherRouteToTheSameUpstreamsRoute(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	a, b := newPeakUpstream(t), newPeakUpstream(t)
	port := freePort(t)
	require.NoError(t, caddy.Load([]byte(olderConfig(port, 1, a, b)), false))
	t.Cleanup(func() { _ = caddy.Stop() })
	onA := sendOlder(t, port, "/0", 1)
	require.Eventually(t, func() bool { return a.now.Load() == 1 }, 10*time.Second, 5*time.Millisecond)
	onB := sendOlder(t, port, "/1", 1) // B's handler records its route last, and its settings are newer
	require.Eventually(t, func() bool { return olderWaiting() == 1 }, 10*time.Second, 5*time.Millisecond)
	moreOnA := sendOlder(t, port, "/0", 3)
	require.Eventually(t, func() bool { return olderWaiting() == 4 }, 10*time.Second, 5*time.Millisecond)

	require.NoError(t, caddy.Load([]byte(olderConfig(port, 3, b)), false))
	require.Eventually(t, func() bool { return b.now.Load() == 2 }, 10*time.Second, 5*time.Millisecond,
		"the backlog runs under the 3 permits with no new request")
	time.Sleep(200 * time.Millisecond) // time for a waiter granted to reach A
	assert.Equal(t, int32(1), a.most.Load(), "A ran more at once than the 1 permit of its route")

	a.open()
	b.open()
	assert.Equal(t, http.StatusOK, <-onA)
	assert.Equal(t, http.StatusOK, <-onB)
	for range 3 {
		assert.Equal(t, http.StatusOK, <-moreOnA)
	}
}
