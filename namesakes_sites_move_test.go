package caddyfairqueue

import (
	"context"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Site 1 (queue "sp" in the local store, r0, 1 permit, which a holder
// runs while a waiter waits) and site 2 (queue "sp" in Redis, key prefix
// "a", r2, 1 permit): a reload moves site 1's queue to Redis under key
// prefix "b" (r1). Site 2's queue counted site 1's old requests as its
// own predecessor's: its request, its queue idle and r2 free, waited
// until site 1's holder ended; and site 2's first request moved site 1's
// waiter into site 2's queue. Site 2's queue, apart from site 1's in the
// config before as in this one, counts none of them, and site 1's waiter
// moves into site 1's new queue, which counts site 1's old holder.
func TestAStoreSwitchOfOneSiteLeavesAnotherSitesQueueOfItsNameApart(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	s := newSwitchingSites(t)
	r0, r1, r2, port, port2, config := s.r0, s.r1, s.r2, s.port, s.port2, s.config
	require.NoError(t, caddy.Load([]byte(config("", r0)), false))
	t.Cleanup(func() { _ = caddy.Stop() })
	holder := holderOn(t, port, r0)
	waiter := postSP(context.Background(), port)
	require.Eventually(t, func() bool { return spWaiting(false) == 1 }, 10*time.Second, 5*time.Millisecond, "the waiter")

	reload(t, config("b", r1))
	site2 := postSP(context.Background(), port2)
	select {
	case code := <-site2:
		assert.Equal(t, 200, code, "site 2's request")
	case <-time.After(10 * time.Second):
		t.Errorf("site 2's request (its queue idle, r2 free) not answered while site 1's old holder runs")
		r0.release <- struct{}{} // the holder ends
		allAnswered(t, map[string]<-chan int{"site 2's request": site2})
	}
	// Site 1's new queue counts site 1's old holder until it ends.
	site1 := postSP(context.Background(), port)
	time.Sleep(500 * time.Millisecond) // time for it to serve its queue (the waiter moves in)
	r0.release <- struct{}{}           // the holder ends (if it still runs)
	r0.release <- struct{}{}           // the waiter, should it run on r0
	allAnswered(t, map[string]<-chan int{"the waiter": waiter, "the holder": holder, "site 1's new request": site1})
	assert.EqualValues(t, 1, r2.arrivals.Load(), "arrivals at r2 (site 2's request only)")
	// The waiter may keep its own route, r0 (two handlers of the config in
	// force name the queue: which replaced its route cannot be told), once
	// the holder has ended.
	assert.EqualValues(t, 1, r0.pk.Load(), "requests at r0 at once")
	assert.EqualValues(t, 3, r0.arrivals.Load()+r1.arrivals.Load(), "arrivals on site 1's routes")
}
