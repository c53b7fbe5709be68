package caddyfairqueue

import (
	"context"
	"time"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
)

// awaitRoute holds a request of a config cleaned up since, which
// Handler.use sent on to c.e, the live queue of its name in another
// store, until a handler of the config in force has served c.e (its
// route is known), as nextQueue holds a waiter that a reload moved:
// until then a grant of c.e's settings, a pool's, has no route of its
// shape and would run on the request's own route, on an upstream that
// the config in force may not count; it does not wait where such a grant
// fits its own route (grantsFitRouteOf). It waits no longer than the
// request's max_wait. retired: c.e was retired meanwhile (another
// reload, the exit) with no route known: it must not wait there either
// (until it closes, c.e still grants under its settings), but in the
// queue in force, if any (acquire, nextQueue).
func (c *call) awaitRoute(ctx context.Context, maxWait time.Duration) (retired bool, err error) {
	// The route first: known for every request of a handler in force,
	// it costs two atomic loads where a Redis store's dataID builds a
	// string.
	if c.e.routes.known() || c.e.data == c.h.backend.dataID() || c.e.grantsFitRouteOf(c.h) {
		return false, nil
	}
	awaitsRoute(c.e)
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for !c.e.routes.known() {
		if c.e.retiredFlag.Load() {
			return true, nil
		}
		if time.Since(c.start) >= maxWait {
			metrics.rejects.WithLabelValues(c.name, string(fairqueue.ReasonTimeout)).Inc()
			return false, &fairqueue.RejectError{Reason: fairqueue.ReasonTimeout, Waited: time.Since(c.start), RetryAfter: time.Second, Err: errMoved}
		}
		select {
		case <-ctx.Done():
			return false, ctx.Err()
		case <-tick.C:
		}
	}
	return false, nil
}
