package caddyfairqueue

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A request of the first config (the local store, static r0, 1 permit,
// which a holder runs) reaches its handler after the reload's cleanup
// (its body was still arriving as the reload ran); the reload kept the
// queue in the local store but gave it a pool (r1, r2). The request
// borrows the queue the config in force shares: it must not run on r0
// beside the holder, nor on r0 at all (no config in force lets r0 run
// anything), but on the pool once the new config serves.
func TestARequestReachingTheOldHandlerAfterAReloadToAPoolInTheSameStoreKeepsR0WithinItsPermits(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	r0, r1, r2 := newGateUpstream(t, true), newGateUpstream(t, false), newGateUpstream(t, false)
	port := freePort(t)
	holder, late := lateAcrossAReload(t, port, storePoolConfig(port, "", 1, r0, nil),
		storePoolConfig(port, "", 0, nil, map[*gateUpstream]int{r1: 2, r2: 2}), r0)
	lateServedByTheNewConfig(t, port, holder, late, r0, []*gateUpstream{r1, r2})
}

// As above, but the reload points the static reverse_proxy at r1 with 2
// permits (the same store): a grant of the new settings (2 permits) must
// not run the late request on r0 (1 permit) beside the holder.
func TestARequestReachingTheOldHandlerAfterAReloadToAnotherUpstreamInTheSameStoreKeepsR0WithinItsPermits(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	r0, r1 := newGateUpstream(t, true), newGateUpstream(t, false)
	port := freePort(t)
	holder, late := lateAcrossAReload(t, port, storePoolConfig(port, "", 1, r0, nil),
		storePoolConfig(port, "", 2, r1, nil), r0)
	lateServedByTheNewConfig(t, port, holder, late, r0, []*gateUpstream{r1})
}

// lateServedByTheNewConfig checks a late request (see lateAcrossAReload)
// that must not run on r0: r0 runs the holder alone while the late
// request waits, the new config then serves a request, the holder ends,
// and every client is answered; r0 ran the holder only, the new
// config's upstreams (ups) the late request and the new config's.
func lateServedByTheNewConfig(t *testing.T, port int, holder, late <-chan int, r0 *gateUpstream, ups []*gateUpstream) {
	t.Helper()
	time.Sleep(500 * time.Millisecond) // time for the late request to be granted and reach an upstream
	assert.EqualValues(t, 1, r0.pk.Load(), "requests at r0 at once: the late request ran beside the holder")
	var early int32
	for _, u := range ups {
		early += u.arrivals.Load()
	}
	assert.Zero(t, early, "the late request ran on the new config's upstreams before that config served")

	third := postSP(context.Background(), port) // the new config serves
	select {
	case code := <-third:
		assert.Equal(t, http.StatusOK, code, "the new config's request")
	case <-time.After(30 * time.Second):
		t.Error("the new config's request not answered")
	}
	r0.release <- struct{}{} // the holder ends
	r0.release <- struct{}{} // the late request, should it run on r0, is not held there
	for name, ch := range map[string]<-chan int{"the late request": late, "the holder": holder} {
		select {
		case code := <-ch:
			assert.Equal(t, http.StatusOK, code, "%s", name)
		case <-time.After(30 * time.Second):
			t.Fatalf("%s not answered", name)
		}
	}
	assert.EqualValues(t, 1, r0.arrivals.Load(), "arrivals at r0 (the holder only)")
	var n int32
	for _, u := range ups {
		n += u.arrivals.Load()
	}
	assert.EqualValues(t, 2, n, "arrivals at the new config's upstreams")
}

// lateAcrossAReload loads first, whose holder runs on r0 (holding), and
// sends a request whose body is still arriving as a reload to second
// runs; then the body ends: the first config's handler, cleaned up, has
// the late request. The statuses come on holder and late (0: no answer).
func lateAcrossAReload(t *testing.T, port int, first, second string, r0 *gateUpstream) (holder, late <-chan int) {
	t.Helper()
	require.NoError(t, caddy.Load([]byte(first), false))
	t.Cleanup(func() { _ = caddy.Stop() })
	holder = postSP(context.Background(), port)
	require.Eventually(t, func() bool { return r0.now.Load() == 1 }, 10*time.Second, 5*time.Millisecond, "the holder on r0")

	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	body, send := io.Pipe()
	t.Cleanup(func() { _ = send.Close() })
	lateCode := make(chan int, 1)
	go func() {
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, fmt.Sprintf("http://127.0.0.1:%d/", port), body)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			lateCode <- 0
			return
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		_ = resp.Body.Close()
		lateCode <- resp.StatusCode
	}()
	// The body begins: the first config's handler has the request.
	_, err := io.WriteString(send, `{"messages":[`)
	require.NoError(t, err)
	time.Sleep(time.Second) // the server has read its header

	reload(t, second)
	_, err = io.WriteString(send, `]}`)
	require.NoError(t, err)
	require.NoError(t, send.Close())
	return holder, lateCode
}
