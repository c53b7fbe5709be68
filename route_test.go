package caddyfairqueue

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/fair-queue/caddy-fair-queue/fairqueue"
	"github.com/fair-queue/caddy-fair-queue/fairqueue/redisstore"
	"github.com/fair-queue/caddy-fair-queue/internal/redistest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A reload that points the route at another upstream (a static
// reverse_proxy from A to B) and raises the permits: the old config's
// waiters, granted under the new permits once the new config serves, run
// on B through the new config's route; A runs only the old requests
// already running, never more than the old config's permits.
func TestAWaiterOfAReplacedConfigIsServedByTheRouteInForce(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	in := func(permits int) *Handler {
		return &Handler{Name: "route-moved", Permits: permits, MaxWait: caddy.Duration(time.Minute)}
	}
	a, b := newHolder(), newHolder()
	letAtCleanup(t, a, b)
	old := provisionLocal(t, newContext(t), in(1))
	r0 := newRequest(context.Background(), `{}`).start(old, a)
	a.waitEntered(t)
	w1 := newRequest(context.Background(), `{}`).start(old, a)
	waitingIn(t, old, 1)
	w2 := newRequest(context.Background(), `{}`).start(old, a)
	waitingIn(t, old, 2)

	// The reload: 4 permits, the route to B; the old config is cleaned
	// up; the new config's first request applies its settings.
	cur := provisionLocal(t, newContext(t), in(4))
	require.Same(t, engineOf(t, old), engineOf(t, cur), "one queue across the reload")
	require.NoError(t, old.Cleanup())
	n1 := newRequest(context.Background(), `{}`).start(cur, b)
	// w1, w2 (granted under the 4 permits) and n1 run.
	require.Eventually(t, func() bool { return a.count.Load()+b.count.Load() == 4 }, 10*time.Second, time.Millisecond)
	assert.Equal(t, int32(1), a.count.Load(), "A ran a waiter of the old config beside r0, above its 1 permit")
	assert.Equal(t, int32(3), b.count.Load())
	a.let()
	b.let()
	for _, r := range []*request{r0, w1, w2, n1} {
		r.wait(t)
		assert.Equal(t, http.StatusOK, r.w.Code)
	}
}

// Where two handlers of the config in force name the queue (two routes
// share it), which of them replaced a waiter's own cannot be told: the
// waiter keeps its own route.
func TestAWaiterOfAReplacedConfigKeepsItsRouteWhereTwoRoutesShareTheQueue(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	in := func() *Handler {
		return &Handler{Name: "route-shared", Permits: 1, MaxWait: caddy.Duration(time.Minute)}
	}
	a, b := newHolder(), newHolder()
	old := provisionLocal(t, newContext(t), in())
	r0 := newRequest(context.Background(), `{}`).start(old, a)
	a.waitEntered(t)
	w1 := newRequest(context.Background(), `{}`).start(old, a)
	waitingIn(t, old, 1)

	ctx := newContext(t) // one config, two handlers of the queue
	cur, other := provisionLocal(t, ctx, in()), provisionLocal(t, ctx, in())
	require.Same(t, engineOf(t, cur), engineOf(t, other))
	require.NoError(t, old.Cleanup())
	n1 := newRequest(context.Background(), `{}`).start(cur, b)
	waitingIn(t, cur, 2)

	a.release <- struct{}{} // r0 ends: w1 runs, on its own route
	r0.wait(t)
	a.waitEntered(t)
	a.release <- struct{}{}
	w1.wait(t)
	b.waitEntered(t)
	b.release <- struct{}{}
	n1.wait(t)
	assert.Equal(t, int32(2), a.count.Load())
	assert.Equal(t, int32(1), b.count.Load())
}

// A waiter of the old config granted under more permits than the new
// config's route has (here by another instance still on the old config)
// keeps its own route: the grant fits the old upstream's permits, and
// would run the new upstream above its own.
func TestAWaiterGrantedUnderTheOldConfigsPermitsKeepsItsRoute(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	rds := redistest.Start(t)
	const name = "route-old-permits"
	in := func(permits int) *Handler {
		return &Handler{Name: name, Permits: permits, MaxWait: caddy.Duration(time.Minute)}
	}
	ctx := context.Background()
	// Another instance, not yet reloaded: 3 permits, 2 of them held.
	other, err := fairqueue.New(redisstore.New(rds.Client(t), name, redisstore.Options{}),
		fairqueue.Config{Name: name, Permits: 3, MaxWait: time.Minute})
	require.NoError(t, err)
	t.Cleanup(func() { _ = other.Close() })
	x1, err := other.Acquire(ctx, fairqueue.Request{})
	require.NoError(t, err)
	x2, err := other.Acquire(ctx, fairqueue.Request{})
	require.NoError(t, err)

	a, b := newHolder(), newHolder()
	letAtCleanup(t, a, b)
	old := provision(t, newContext(t), rds.Addr(), in(3))
	r0 := newRequest(ctx, `{}`).start(old, a)
	a.waitEntered(t)
	w1 := newRequest(ctx, `{}`).start(old, a)
	waitingIn(t, old, 1)

	// The reload here: 1 permit, the route to B; the old config is cleaned
	// up; the new config's first request applies its settings and waits.
	cur := provision(t, newContext(t), rds.Addr(), in(1))
	require.Same(t, engineOf(t, old), engineOf(t, cur))
	require.NoError(t, old.Cleanup())
	n1 := newRequest(ctx, `{}`).start(cur, b)
	waitingIn(t, cur, 2)

	x1.Release() // the other instance hands its permit on under its 3 permits: to w1
	require.Eventually(t, func() bool { return a.count.Load()+b.count.Load() == 2 }, 10*time.Second, time.Millisecond)
	assert.Equal(t, int32(2), a.count.Load(), "w1, granted under 3 permits, ran on B, whose config allows 1")
	assert.Zero(t, b.count.Load())

	a.let()
	b.let()
	x2.Release()
	for _, r := range []*request{r0, w1, n1} {
		r.wait(t)
		assert.Equal(t, http.StatusOK, r.w.Code)
	}
}
