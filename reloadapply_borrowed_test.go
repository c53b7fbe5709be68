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

	"github.com/fair-queue/caddy-fair-queue/internal/redistest"
)

// A request of the first config (the local store, static r0, 1 permit,
// which a holder runs) reaches its handler after the reload's cleanup:
// its body was still arriving as the reload ran. The reload moved the
// queue to Redis and gave it a pool (r1, r2, 2 permits each), and no request of the new
// config has served yet. The request waits in the new queue, and a grant
// there names a pool upstream, which its own static route cannot take:
// it must not run on r0 beside the holder (r0 has 1 permit, and none in
// the config in force), but wait, as a waiter the reload moved does,
// for the new config to serve, then run on the pool. Before, it ran on
// r0 at once.
func TestARequestReachingTheOldHandlerAfterAReloadToAPoolInAnotherStoreKeepsR0WithinItsPermits(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	rds := redistest.Start(t)
	r0, r1, r2 := newGateUpstream(t, true), newGateUpstream(t, false), newGateUpstream(t, false)
	port := freePort(t)

	require.NoError(t, caddy.Load([]byte(storePoolConfig(port, "", 1, r0, nil)), false))
	t.Cleanup(func() { _ = caddy.Stop() })
	holder := postSP(context.Background(), port)
	require.Eventually(t, func() bool { return r0.now.Load() == 1 }, 10*time.Second, 5*time.Millisecond, "the holder on r0")

	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	body, send := io.Pipe()
	t.Cleanup(func() { _ = send.Close() })
	late := make(chan int, 1)
	go func() {
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, fmt.Sprintf("http://127.0.0.1:%d/", port), body)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			late <- 0
			return
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		_ = resp.Body.Close()
		late <- resp.StatusCode
	}()
	// The body begins: the first config's handler has the request.
	_, err := io.WriteString(send, `{"messages":[`)
	require.NoError(t, err)
	time.Sleep(time.Second) // the server has read its header

	reload(t, storePoolConfig(port, rds.Addr(), 0, nil, map[*gateUpstream]int{r1: 2, r2: 2}))
	_, err = io.WriteString(send, `]}`)
	require.NoError(t, err)
	require.NoError(t, send.Close())
	time.Sleep(500 * time.Millisecond) // time for the late request to be granted and reach an upstream
	assert.EqualValues(t, 1, r0.pk.Load(), "requests at r0 at once: the late request ran beside the holder")
	assert.Zero(t, r1.arrivals.Load()+r2.arrivals.Load(), "the late request ran on the pool before its config served")

	third := postSP(context.Background(), port) // the new config serves: its pool's route
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
	assert.EqualValues(t, 2, r1.arrivals.Load()+r2.arrivals.Load(), "arrivals at r1 and r2")
}
