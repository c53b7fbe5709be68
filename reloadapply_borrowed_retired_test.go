package caddyfairqueue

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/fair-queue/caddy-fair-queue/internal/redistest"
)

// As in TestARequestReachingTheOldHandlerAfterAReloadToAPoolInAnotherStoreKeepsR0WithinItsPermits,
// a late request of the first config (static r0) waits for the second
// config (a pool in Redis) to serve; before it does, a third reload
// moves the queue to another Redis (static r3, 2 permits: the holder counts against them). The pool's queue,
// retired before any of its requests recorded a route, must not grant
// the late request a pool's upstream on its own route (r0, beside the
// holder): the request waits on for the config in force, and runs
// under it once it serves. Before, the retired queue granted it at once
// and it ran on r0 (at the exit too, where the retired queue closes,
// TestARequestHeldForTheNewConfigAfterAReloadIsAnsweredAtTheExit now and
// then saw it cut there, 499, instead of answered 503).
func TestARequestHeldForTheNewConfigKeepsR0WithinItsPermitsWhenAnotherReloadRetiresTheQueue(t *testing.T) {
	held := make(chan struct{}, 4)
	awaitsRoute = func(*engine) { held <- struct{}{} }
	t.Cleanup(func() { awaitsRoute = func(*engine) {} })
	r0, r1, r2, holder, late, port := lateAfterAReloadToAPool(t)
	select {
	case <-held:
	case <-time.After(10 * time.Second):
		t.Fatal("the late request never waited for the new config's route")
	}
	rds := redistest.Start(t)
	r3 := newGateUpstream(t, false)
	reload(t, storePoolConfig(port, rds.Addr(), 2, r3, nil))
	lateServedByTheNewConfig(t, port, holder, late, r0, []*gateUpstream{r3})
	assert.Zero(t, r1.arrivals.Load()+r2.arrivals.Load(), "arrivals at the pool, which no config in force has")
	assert.EqualValues(t, 2, r3.arrivals.Load(), "arrivals at r3")
}
