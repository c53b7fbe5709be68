package caddyfairqueue

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/internal/redistest"
)

// As TestAWaiterGrantedUnderTheNewPermitsBeforeTheOldConfigsCleanupRunsOnTheNewRoute,
// but the reload also moves the queue from the local store to Redis:
// while both configs run, the old queue grants its waiter nothing beside
// A's request, nor the new queue its own (the old queue's waiter came
// first), and once the old config is
// cleaned up the waiter moves into the new queue and runs on B, the new
// route, not on A beside A's request.
func TestAWaiterOfAQueueMovedToAnotherStoreNeverRunsOnItsOwnRouteBesideItsRequest(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	rds := redistest.Start(t)
	in := func(permits int) *Handler {
		return &Handler{Name: "route-moved-store", Permits: permits, MaxWait: caddy.Duration(time.Minute)}
	}
	a, b := newHolder(), newHolder()
	letAtCleanup(t, a, b)
	old := provisionLocal(t, newContext(t), in(1))
	r0 := newRequest(context.Background(), `{}`).start(old, a)
	a.waitEntered(t)
	w1 := newRequest(context.Background(), `{}`).start(old, a)
	waitingIn(t, old, 1)

	cur := provision(t, newContext(t), rds.Addr(), in(4))
	require.NotSame(t, engineOf(t, old), engineOf(t, cur), "two queues: the store moved")
	// n1 waits: the old queue's waiter began to wait first, and the new
	// queue grants nothing while the old one may grant it.
	n1 := newRequest(context.Background(), `{}`).start(cur, b)
	waitingIn(t, cur, 1)
	assert.Equal(t, int32(1), a.count.Load(), "the old queue granted its waiter beside r0 while both configs run")
	require.NoError(t, old.Cleanup()) // w1 moves into the new queue
	require.Eventually(t, func() bool { return a.count.Load()+b.count.Load() == 3 }, 10*time.Second, time.Millisecond)
	assert.Equal(t, int32(1), a.count.Load(), "A ran the moved waiter beside r0, above its 1 permit")
	assert.Equal(t, int32(2), b.count.Load())
	a.let()
	b.let()
	for _, r := range []*request{r0, w1, n1} {
		r.wait(t)
		assert.Equal(t, http.StatusOK, r.w.Code)
	}
}
