package caddyfairqueue

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// As TestAWaiterOfAReplacedConfigIsServedByTheRouteInForce, but the new
// config serves its first request before the old config is cleaned up
// (Caddy starts the new config, then stops the old one): the old
// config's waiters, granted under the new permits then, run on B too,
// not on A beside A's running request.
func TestAWaiterGrantedUnderTheNewPermitsBeforeTheOldConfigsCleanupRunsOnTheNewRoute(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	in := func(permits int) *Handler {
		return &Handler{Name: "route-moved-overlap", Permits: permits, MaxWait: caddy.Duration(time.Minute)}
	}
	a, b := newHolder(), newHolder()
	letAtCleanup(t, a, b)
	old := provisionLocal(t, newContext(t), in(1))
	r0 := newRequest(context.Background(), `{}`).start(old, a)
	a.waitEntered(t)
	w1 := newRequest(context.Background(), `{}`).start(old, a)
	waitingIn(t, old, 1)

	// The reload: 4 permits, the route to B; the new config's first
	// request applies its settings while the old config is still live.
	cur := provisionLocal(t, newContext(t), in(4))
	require.Same(t, engineOf(t, old), engineOf(t, cur), "one queue across the reload")
	n1 := newRequest(context.Background(), `{}`).start(cur, b)
	// w1 (granted under the 4 permits) and n1 run.
	require.Eventually(t, func() bool { return a.count.Load()+b.count.Load() == 3 }, 10*time.Second, time.Millisecond)
	assert.Equal(t, int32(1), a.count.Load(), "A ran a waiter of the old config beside r0, above its 1 permit")
	assert.Equal(t, int32(2), b.count.Load())
	require.NoError(t, old.Cleanup())
	a.let()
	b.let()
	for _, r := range []*request{r0, w1, n1} {
		r.wait(t)
		assert.Equal(t, http.StatusOK, r.w.Code)
	}
}
