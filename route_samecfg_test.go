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

// One config, no reload: a handler that names its queue from the request
// (its route to A) and a later one of the same config that names the
// same queue statically (its route to B; the only handler of the config
// that claims it). A waiter of the first is granted after the second
// has served the queue: it runs on A, its own route, not on B (another
// upstream: another answer than the client asked for). The later
// handler's route stands for a replaced config's, never for another
// route of the config in force.
func TestAWaiterOfAnotherRouteOfTheSameConfigKeepsItsOwnRoute(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	a, b := newHolder(), newHolder()
	letAtCleanup(t, a, b)
	ctx := newContext(t)
	byModel := provisionLocal(t, ctx, &Handler{Name: "{http.fair_queue.model}", Permits: 1, MaxWait: caddy.Duration(time.Minute)})
	static := provisionLocal(t, ctx, &Handler{Name: "route-samecfg", Permits: 1, MaxWait: caddy.Duration(time.Minute)})
	require.Greater(t, static.gen, byModel.gen)

	body := `{"model":"route-samecfg"}`
	r0 := newRequest(context.Background(), body).start(byModel, a)
	a.waitEntered(t)
	w1 := newRequest(context.Background(), body).start(byModel, a)
	waitingIn(t, static, 1)
	require.Same(t, engineOf(t, static), byModel.engineList()[0], "one queue")
	n1 := newRequest(context.Background(), `{}`).start(static, b) // the static handler serves: its route recorded
	waitingIn(t, static, 2)

	a.let() // r0 ends: w1 is granted, then n1
	b.waitEntered(t)
	assert.Equal(t, int32(2), a.count.Load(), "a request of the by-model route ran on B, the static route's upstream")
	assert.Equal(t, int32(1), b.count.Load())
	b.let()
	for _, r := range []*request{r0, w1, n1} {
		r.wait(t)
		assert.Equal(t, http.StatusOK, r.w.Code)
	}
}

// A reload to a config with a handler that names the queue from the
// request (as the old route did, its route to A) and one that names it
// statically (its route to B): which of the two replaced the old
// config's route cannot be told, so a waiter of the old config keeps
// its own route, A, also once the static one has served the queue,
// whether the old config is still running beside the new one or
// already cleaned up.
func TestAWaiterKeepsItsRouteWhereTheNewConfigAlsoNamesTheQueueFromTheRequest(t *testing.T) {
	for _, cleaned := range []bool{false, true} {
		t.Run(map[bool]string{false: "overlap", true: "cleaned"}[cleaned], func(t *testing.T) {
			t.Cleanup(func() { poolEmpty(t) })
			a, a2, b := newHolder(), newHolder(), newHolder()
			letAtCleanup(t, a, b, a2)
			in := func(name string) *Handler {
				return &Handler{Name: name, Permits: 1, MaxWait: caddy.Duration(time.Minute)}
			}
			old := provisionLocal(t, newContext(t), in("{http.fair_queue.model}"))
			body := `{"model":"route-fromreq"}`
			r0 := newRequest(context.Background(), body).start(old, a)
			a.waitEntered(t)
			w1 := newRequest(context.Background(), body).start(old, a)
			require.Eventually(t, func() bool { return len(old.engineList()) == 1 }, 5*time.Second, time.Millisecond)
			waitingIn(t, old, 1)

			ctx := newContext(t)
			_ = provisionLocal(t, ctx, in("{http.fair_queue.model}")) // to A2, serves nothing yet
			static := provisionLocal(t, ctx, in("route-fromreq"))
			n1 := newRequest(context.Background(), `{}`).start(static, b)
			waitingIn(t, static, 2)
			if cleaned {
				require.NoError(t, old.Cleanup())
			}

			a.let() // r0 ends: w1 is granted, then n1
			b.waitEntered(t)
			assert.Equal(t, int32(2), a.count.Load(), "a waiter of the by-model route ran on B, the static route's upstream")
			assert.Equal(t, int32(1), b.count.Load())
			b.let()
			for _, r := range []*request{r0, w1, n1} {
				r.wait(t)
				assert.Equal(t, http.StatusOK, r.w.Code)
			}
		})
	}
}
