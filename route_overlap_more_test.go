package caddyfairqueue

import (
	"context"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Three configs at once: N (1 permit, its route to A, which runs one
// request, a second waiting), N+1 (2 permits, to B) that never serves,
// cleaned up first or not (a load that failed before serving), and N+2
// (4 permits, to C) that serves. N's waiter, granted under N+2's
// permits, runs on C, never on A beside A's request, nor on B.
func TestAWaiterOfTheOldestOfThreeConfigsRunsOnTheRouteOfTheOneThatServed(t *testing.T) {
	for _, cleanFirst := range []bool{false, true} {
		t.Run(map[bool]string{false: "all-live", true: "middle-cleaned"}[cleanFirst], func(t *testing.T) {
			t.Cleanup(func() { poolEmpty(t) })
			in := func(permits int) *Handler {
				return &Handler{Name: "route-three", Permits: permits, MaxWait: caddy.Duration(time.Minute)}
			}
			a, b, c := newHolder(), newHolder(), newHolder()
			t.Cleanup(func() { b.let() })
			letAtCleanup(t, a, c)
			n := provisionLocal(t, newContext(t), in(1))
			r0 := newRequest(context.Background(), `{}`).start(n, a)
			a.waitEntered(t)
			w1 := newRequest(context.Background(), `{}`).start(n, a)
			waitingIn(t, n, 1)

			middle := provisionLocal(t, newContext(t), in(2))
			if cleanFirst {
				require.NoError(t, middle.Cleanup())
			}
			last := provisionLocal(t, newContext(t), in(4))
			n1 := newRequest(context.Background(), `{}`).start(last, c)
			require.Eventually(t, func() bool { return a.count.Load()+c.count.Load() == 3 }, 10*time.Second, time.Millisecond)
			assert.Equal(t, int32(1), a.count.Load(), "A ran N's waiter beside r0, above its 1 permit")
			assert.Equal(t, int32(0), b.count.Load())
			assert.Equal(t, int32(2), c.count.Load())
			require.NoError(t, n.Cleanup())
			a.let()
			c.let()
			for _, r := range []*request{r0, w1, n1} {
				r.wait(t)
				assert.Equal(t, http.StatusOK, r.w.Code)
			}
		})
	}
}

// The later config has fewer permits (1, its route to B) than the grant
// of the old config's waiter was made under (2, the old config's, route
// A): while both configs run, the waiter keeps its own route, A, where
// those permits were set; B never runs more than its 1.
func TestAGrantUnderMorePermitsThanTheLaterConfigsKeepsItsOwnRouteWhileBothRun(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	in := func(permits int) *Handler {
		return &Handler{Name: "route-fewer", Permits: permits, MaxWait: caddy.Duration(time.Minute)}
	}
	a, b := newHolder(), newHolder()
	letAtCleanup(t, a, b)
	old := provisionLocal(t, newContext(t), in(2))
	r0 := newRequest(context.Background(), `{}`).start(old, a)
	r1 := newRequest(context.Background(), `{}`).start(old, a)
	a.waitEntered(t)
	a.waitEntered(t)
	w1 := newRequest(context.Background(), `{}`).start(old, a)
	waitingIn(t, old, 1)

	var arrived atomic.Int32
	var holding atomic.Bool
	holding.Store(true)
	hold := make(chan struct{})
	var once sync.Once
	unhold := func() { once.Do(func() { close(hold) }) }
	t.Cleanup(unhold)
	grantArrived = func(*engine) {
		if holding.Load() {
			arrived.Add(1)
			<-hold
		}
	}
	t.Cleanup(func() { grantArrived = func(*engine) {} })
	a.release <- struct{}{} // one of r0, r1 ends: w1 is granted under the old config's 2 permits
	require.Eventually(t, func() bool { return arrived.Load() == 1 }, 10*time.Second, time.Millisecond)

	cur := provisionLocal(t, newContext(t), in(1))
	holding.Store(false)
	n1 := newRequest(context.Background(), `{}`).start(cur, b) // records B's route, applies 1 permit: waits
	waitingIn(t, cur, 1)
	unhold()
	require.Eventually(t, func() bool { return a.count.Load() == 3 }, 10*time.Second, time.Millisecond,
		"w1 runs on A, its own route")
	assert.Equal(t, int32(0), b.count.Load(), "B ran a grant made under the old config's 2 permits, above its own 1 once n1 runs")
	require.NoError(t, old.Cleanup())
	a.let()
	b.waitEntered(t)
	b.let()
	for _, r := range []*request{r0, r1, w1, n1} {
		r.wait(t)
		assert.Equal(t, http.StatusOK, r.w.Code)
	}
}
