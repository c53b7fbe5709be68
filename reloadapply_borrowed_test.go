package caddyfairqueue

import (
	"net/http"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/stretchr/testify/assert"

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
	r0, r1, r2, holder, late, port := lateAfterAReloadToAPool(t)
	lateServedByTheNewConfig(t, port, holder, late, r0, []*gateUpstream{r1, r2})
}

// As above, but the process exits before any request of the new config:
// the late request, held until the new config serves, is answered at
// once (the new config's cleanup retires the queue it waits for), not
// left until its max_wait (1m).
func TestARequestHeldForTheNewConfigAfterAReloadIsAnsweredAtTheExit(t *testing.T) {
	r0, _, _, holder, late, _ := lateAfterAReloadToAPool(t)
	t.Cleanup(func() { exitingForTest.Store(false) })
	exitingForTest.Store(true) // the process exits (SIGTERM, caddy stop)
	stopped := make(chan error, 1)
	go func() { stopped <- caddy.Stop() }()
	select {
	case code := <-late:
		assert.Equal(t, http.StatusServiceUnavailable, code, "the late request")
	case <-time.After(10 * time.Second):
		t.Error("the late request was not answered within 10s of the exit (max_wait 1m)")
	}
	r0.release <- struct{}{} // the holder ends
	r0.release <- struct{}{} // the late request, should it run on r0, is not held there
	for name, ch := range map[string]<-chan int{"the holder": holder, "caddy.Stop": errDone(stopped)} {
		select {
		case <-ch:
		case <-time.After(30 * time.Second):
			t.Fatalf("%s did not return", name)
		}
	}
}

// errDone yields a value once ch has.
func errDone(ch <-chan error) <-chan int {
	out := make(chan int, 1)
	go func() { <-ch; out <- 0 }()
	return out
}

// lateAfterAReloadToAPool loads the first config (the local store, static
// r0, 1 permit), whose holder runs on r0, and sends a request whose body
// is still arriving as a reload to the second config (Redis, a pool of
// r1 and r2, 2 permits each) runs; then the body ends: the first
// config's handler, cleaned up, has the late request.
func lateAfterAReloadToAPool(t *testing.T) (r0, r1, r2 *gateUpstream, holder, late <-chan int, port int) {
	t.Helper()
	t.Cleanup(func() { poolEmpty(t) })
	rds := redistest.Start(t)
	r0, r1, r2 = newGateUpstream(t, true), newGateUpstream(t, false), newGateUpstream(t, false)
	port = freePort(t)
	holder, late = lateAcrossAReload(t, port, storePoolConfig(port, "", 1, r0, nil),
		storePoolConfig(port, rds.Addr(), 0, nil, map[*gateUpstream]int{r1: 2, r2: 2}), r0)
	return r0, r1, r2, holder, late, port
}
