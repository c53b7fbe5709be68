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

	"github.com/fair-queue/caddy-fair-queue/internal/redistest"
)

// gateUpstream counts its arrivals and the most it runs at once; with
// hold set, each request waits for a token on release.
type gateUpstream struct {
	srv               *httptest.Server
	arrivals, now, pk atomic.Int32
	release           chan struct{}
}

func newGateUpstream(t *testing.T, hold bool) *gateUpstream {
	t.Helper()
	g := &gateUpstream{release: make(chan struct{}, 16)}
	g.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		g.arrivals.Add(1)
		n := g.now.Add(1)
		for m := g.pk.Load(); n > m && !g.pk.CompareAndSwap(m, n); m = g.pk.Load() {
		}
		if hold {
			select {
			case <-g.release:
			case <-r.Context().Done():
			}
		}
		g.now.Add(-1)
		w.WriteHeader(http.StatusOK)
	}))
	t.Cleanup(g.srv.Close)
	return g
}

func (g *gateUpstream) dial() string { return strings.TrimPrefix(g.srv.URL, "http://") }

// storePoolConfig is queue "sp" on one route: in Redis at addr ("" the
// local store), with permits and a static reverse_proxy to static, or
// with a pool of upstreams (dial: permits) and dynamic fair_queue.
func storePoolConfig(port int, addr string, permits int, static *gateUpstream, pool map[*gateUpstream]int) string {
	fq := `{"handler":"fair_queue","name":"sp","max_wait":"1m"`
	if addr != "" {
		fq += fmt.Sprintf(`,"redis":{"addresses":[%q]}`, addr)
	}
	rp := `{"handler":"reverse_proxy","dynamic_upstreams":{"source":"fair_queue"}}`
	if static != nil {
		fq += fmt.Sprintf(`,"permits":%d`, permits)
		rp = fmt.Sprintf(`{"handler":"reverse_proxy","upstreams":[{"dial":%q}]}`, static.dial())
	} else {
		var ups []string
		for u, n := range pool {
			ups = append(ups, fmt.Sprintf(`{"dial":%q,"permits":%d}`, u.dial(), n))
		}
		fq += `,"upstreams":[` + strings.Join(ups, ",") + `]`
	}
	return fmt.Sprintf(`{"admin":{"disabled":true},"logging":{"logs":{"default":{"level":"ERROR"}}},
	"apps":{"http":{"servers":{"s":{"listen":["127.0.0.1:%d"],"routes":[{"handle":[%s},%s]}]}}}}}`, port, fq, rp)
}

// spWaiting is how many wait in queue "sp" in Redis (remote) or the
// local store.
func spWaiting(remote bool) int {
	for _, e := range openEngines() {
		if e.name == "sp" && e.remote == remote {
			if snap, err := e.q.Inspect(context.Background(), 0, 0); err == nil {
				return snap.Waiting
			}
		}
	}
	return -1
}

// postSP sends one request to the config's route; its status comes on
// the channel (0: no answer).
func postSP(ctx context.Context, port int) <-chan int {
	code := make(chan int, 1)
	go func() {
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, fmt.Sprintf("http://127.0.0.1:%d/", port),
			strings.NewReader(`{"messages":[]}`))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			code <- 0
			return
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		_ = resp.Body.Close()
		code <- resp.StatusCode
	}()
	return code
}

// A waiter of a local-store config (static r0, 1 permit) moves to Redis
// with the first request of the next config (static r2, 1 permit), is
// granted there under that config's settings, and its grant reaches it
// only once a third config (a pool of r1 and r2, the same Redis) has
// served: a grant made under the second config's settings takes the
// second config's route (r2), never the waiter's own (r0), which no
// config in force since the first lets run anything. Before, the
// waiter ran on r0 beside no count of it (the reload chaos test saw
// r0 run 1 under configs that gave it 0).
func TestAGrantMadeUnderAMovedQueuesSettingsTakesTheirRouteAfterAReloadToAPool(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	rds := redistest.Start(t)
	r0, r1, r2 := newGateUpstream(t, true), newGateUpstream(t, false), newGateUpstream(t, false)
	port := freePort(t)

	require.NoError(t, caddy.Load([]byte(storePoolConfig(port, "", 1, r0, nil)), false))
	t.Cleanup(func() { _ = caddy.Stop() })
	holder := postSP(context.Background(), port)
	require.Eventually(t, func() bool { return r0.now.Load() == 1 }, 10*time.Second, 5*time.Millisecond, "the holder on r0")
	waiter := postSP(context.Background(), port)
	require.Eventually(t, func() bool { return spWaiting(false) == 1 }, 10*time.Second, 5*time.Millisecond, "the waiter")

	// The first grant in Redis (the waiter's) is held before it reaches
	// the request.
	held, release := holdFirstRemoteGrant(t)

	reload(t, storePoolConfig(port, rds.Addr(), 1, r2, nil))
	// The second config serves: its request moves the waiter to Redis,
	// where both wait behind the holder (counted there); it then leaves.
	ctx, cancel := context.WithCancel(context.Background())
	mover := postSP(ctx, port)
	require.Eventually(t, func() bool { return spWaiting(true) == 2 }, 10*time.Second, 5*time.Millisecond,
		"the second config's request and the moved waiter in Redis")
	cancel()
	<-mover
	require.Eventually(t, func() bool { return spWaiting(true) == 1 }, 10*time.Second, 5*time.Millisecond,
		"the moved waiter alone in Redis")

	r0.release <- struct{}{} // the holder ends: Redis grants the waiter under the second config's settings
	select {
	case <-held:
	case <-time.After(10 * time.Second):
		t.Fatal("the moved waiter was not granted")
	}
	reload(t, storePoolConfig(port, rds.Addr(), 0, nil, map[*gateUpstream]int{r1: 2, r2: 1}))
	servedUnderThePool(t, port, release, holder, waiter, r0, r1, r2)
}

// servedUnderThePool ends the cases where a held grant meets a pool's
// config: a request serves the pool's settings, then the grant goes on
// (release), the holder ends; every client is served, r0 ran the holder
// only, and the pool's upstreams the waiter and that request.
func servedUnderThePool(t *testing.T, port int, release func(), holder, waiter <-chan int, r0, r1, r2 *gateUpstream) {
	t.Helper()
	third := postSP(context.Background(), port) // applies the pool's settings
	select {
	case code := <-third:
		assert.Equal(t, http.StatusOK, code, "the third config's request")
	case <-time.After(30 * time.Second):
		t.Fatal("the third config's request not answered")
	}
	release()
	r0.release <- struct{}{} // the waiter, should it run on r0, is not held there

	for name, ch := range map[string]<-chan int{"the holder": holder, "the waiter": waiter} {
		select {
		case code := <-ch:
			assert.Equal(t, http.StatusOK, code, "%s", name)
		case <-time.After(30 * time.Second):
			t.Fatalf("%s not answered", name)
		}
	}
	assert.EqualValues(t, 1, r0.arrivals.Load(), "arrivals at r0 (the holder only): the waiter's grant was made for r2")
	assert.EqualValues(t, 2, r1.arrivals.Load()+r2.arrivals.Load(), "arrivals at r1 and r2")
}

// holdFirstRemoteGrant holds the first grant queue "sp" gets from its
// store before it reaches its request: held closes then, and release
// lets it go on (at the test's end at the latest).
func holdFirstRemoteGrant(t *testing.T) (held <-chan struct{}, release func()) {
	h, r := make(chan struct{}), make(chan struct{})
	var first atomic.Bool
	grantArrived = func(e *engine) {
		if e.name == "sp" && e.remote && first.CompareAndSwap(false, true) {
			close(h)
			<-r
		}
	}
	var once sync.Once
	release = func() { once.Do(func() { close(r) }) }
	t.Cleanup(func() { grantArrived = func(*engine) {} })
	t.Cleanup(release)
	return h, release
}
