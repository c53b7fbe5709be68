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
	lateRunsBesideTheHolder(t, holder, late, r0)
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
	lateRunsBesideTheHolder(t, holder, late, r1)
}

// lateRunsBesideTheHolder checks a late request (see lateAcrossAReload)
// that must run at once on u, beside the holder, with no request of the
// new config: both reach u, then are let go and answered 200; u ran
// those two only.
func lateRunsBesideTheHolder(t *testing.T, holder, late <-chan int, u *gateUpstream) {
	t.Helper()
	assert.Eventually(t, func() bool { return u.now.Load() == 2 }, 20*time.Second, 5*time.Millisecond,
		"the late request did not reach the upstream beside the holder (no request of the new config came)")
	u.release <- struct{}{}
	u.release <- struct{}{}
	for name, ch := range map[string]<-chan int{"the late request": late, "the holder": holder} {
		select {
		case code := <-ch:
			assert.Equal(t, http.StatusOK, code, "%s", name)
		case <-time.After(90 * time.Second):
			require.Failf(t, "not answered", "%s", name)
		}
	}
	assert.EqualValues(t, 2, u.pk.Load(), "requests at the upstream at once")
	assert.EqualValues(t, 2, u.arrivals.Load(), "arrivals at the upstream")
}
