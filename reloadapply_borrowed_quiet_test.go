package caddyfairqueue

import (
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/internal/redistest"
)

// A request of the first config (the local store, static r0, 2 permits,
// one of which a holder runs) reaches its handler after the reload's
// cleanup (its body was still arriving as the reload ran). The reload
// moved the queue to Redis and changed nothing else: the same static r0,
// 2 permits. The new queue's grants fit the request's own route, and
// the new queue counts the holder: the request runs at once, beside the
// holder, within r0's permits, though no request of the new config
// comes (a quiet server). Before, it waited for one, and without one
// was refused at its max_wait (1m).
func TestARequestReachingTheOldHandlerAfterAReloadToAnotherStoreAloneRunsWhereNothingElseChanged(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	rds := redistest.Start(t)
	r0 := newGateUpstream(t, true)
	port := freePort(t)
	holder, late := lateAcrossAReload(t, port, storePoolConfig(port, "", 2, r0, nil),
		storePoolConfig(port, rds.Addr(), 2, r0, nil), r0)
	assert.Eventually(t, func() bool { return r0.now.Load() == 2 }, 20*time.Second, 5*time.Millisecond,
		"the late request did not reach r0 beside the holder (no request of the new config came)")
	r0.release <- struct{}{}
	r0.release <- struct{}{}
	for name, ch := range map[string]<-chan int{"the late request": late, "the holder": holder} {
		select {
		case code := <-ch:
			assert.Equal(t, http.StatusOK, code, "%s", name)
		case <-time.After(90 * time.Second):
			require.Failf(t, "not answered", "%s", name)
		}
	}
	assert.EqualValues(t, 2, r0.pk.Load(), "requests at r0 at once")
	assert.EqualValues(t, 2, r0.arrivals.Load(), "arrivals at r0")
}

// As above, with a pool on both sides (r1, 2 permits): the new queue's
// grant names r1, which the late request's own route (dynamic
// fair_queue) takes; it runs at once beside the holder.
func TestARequestReachingTheOldHandlerAfterAReloadToAnotherStoreAloneRunsOnThePoolItKept(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	rds := redistest.Start(t)
	r1 := newGateUpstream(t, true)
	port := freePort(t)
	holder, late := lateAcrossAReload(t, port, storePoolConfig(port, "", 0, nil, map[*gateUpstream]int{r1: 2}),
		storePoolConfig(port, rds.Addr(), 0, nil, map[*gateUpstream]int{r1: 2}), r1)
	assert.Eventually(t, func() bool { return r1.now.Load() == 2 }, 20*time.Second, 5*time.Millisecond,
		"the late request did not reach r1 beside the holder (no request of the new config came)")
	r1.release <- struct{}{}
	r1.release <- struct{}{}
	for name, ch := range map[string]<-chan int{"the late request": late, "the holder": holder} {
		select {
		case code := <-ch:
			assert.Equal(t, http.StatusOK, code, "%s", name)
		case <-time.After(90 * time.Second):
			require.Failf(t, "not answered", "%s", name)
		}
	}
	assert.EqualValues(t, 2, r1.pk.Load(), "requests at r1 at once")
}
