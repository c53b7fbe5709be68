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
// runs) and site 2 (queue "sp" in Redis, key prefix "a", r2, 1 permit):
// a reload moves site 1's queue to Redis under key prefix "b", a second
// one back to the local store, while the holder of the first config
// still runs in site 1's first queue. That queue's successor is now in
// its own store: site 2's queue counted the holder as the running
// request of a queue moved to its store (its request, its queue idle
// and r2 free, waited until the holder ended). It counts none of it.
func TestAStoreSwitchOfOneSiteAndBackLeavesAnotherSitesQueueOfItsNameApart(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	s := newSwitchingSites(t)
	r0, r1, r2, port, port2, config := s.r0, s.r1, s.r2, s.port, s.port2, s.config
	require.NoError(t, caddy.Load([]byte(config("", r0)), false))
	t.Cleanup(func() { _ = caddy.Stop() })
	holder := holderOn(t, port, r0)

	reload(t, config("b", r1))
	reload(t, config("", r0))
	site2 := postSP(context.Background(), port2)
	select {
	case code := <-site2:
		assert.Equal(t, 200, code, "site 2's request")
	case <-time.After(10 * time.Second):
		t.Errorf("site 2's request (its queue idle, r2 free) not answered while site 1's old holder runs")
		r0.release <- struct{}{} // the holder ends
		allAnswered(t, map[string]<-chan int{"site 2's request": site2})
	}
	r0.release <- struct{}{} // the holder ends (if it still runs)
	allAnswered(t, map[string]<-chan int{"the holder": holder})
	assert.EqualValues(t, 1, r0.arrivals.Load(), "arrivals at r0 (the holder)")
	assert.EqualValues(t, 0, r1.arrivals.Load(), "arrivals at r1")
	assert.EqualValues(t, 1, r2.arrivals.Load(), "arrivals at r2 (site 2's request only)")
}

// As above, with a waiter of site 1's first config in its first queue
// (no request of site 1 came while its queue was in Redis: the waiter
// stayed there): site 2's first request after the second reload moved
// it into site 2's queue, where, granted once the holder ended, it held
// site 2's one permit while it ran on r0: site 2's next request, its
// upstream free, waited for it. It stays in site 1's store.
func TestAStoreSwitchOfOneSiteAndBackLeavesItsWaiterOutOfAnotherSitesQueue(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	s := newSwitchingSites(t)
	r0, r1, r2, port, port2, config := s.r0, s.r1, s.r2, s.port, s.port2, s.config
	require.NoError(t, caddy.Load([]byte(config("", r0)), false))
	t.Cleanup(func() { _ = caddy.Stop() })
	holder := holderOn(t, port, r0)
	waiter := postSP(context.Background(), port)
	require.Eventually(t, func() bool { return spWaiting(false) == 1 }, 10*time.Second, 5*time.Millisecond, "the waiter")

	reload(t, config("b", r1))
	reload(t, config("", r0))
	site2 := postSP(context.Background(), port2)
	time.Sleep(500 * time.Millisecond) // time for site 2's request to serve its queue
	r0.release <- struct{}{}           // the holder ends
	allAnswered(t, map[string]<-chan int{"site 2's request": site2, "the holder": holder})
	require.Eventually(t, func() bool { return r0.now.Load() == 1 }, 10*time.Second, 5*time.Millisecond, "the waiter on r0")
	next := postSP(context.Background(), port2)
	select {
	case code := <-next:
		assert.Equal(t, 200, code, "site 2's next request")
	case <-time.After(10 * time.Second):
		t.Errorf("site 2's next request (r2 free) not answered while site 1's old waiter runs")
		r0.release <- struct{}{} // the waiter ends
		allAnswered(t, map[string]<-chan int{"site 2's next request": next})
	}
	r0.release <- struct{}{} // the waiter ends (if it still runs)
	allAnswered(t, map[string]<-chan int{"the waiter": waiter})
	assert.EqualValues(t, 2, r0.arrivals.Load(), "arrivals at r0 (the holder and the waiter)")
	assert.EqualValues(t, 1, r0.pk.Load(), "requests at r0 at once")
	assert.EqualValues(t, 0, r1.arrivals.Load(), "arrivals at r1")
	assert.EqualValues(t, 2, r2.arrivals.Load(), "arrivals at r2 (site 2's requests only)")
}
