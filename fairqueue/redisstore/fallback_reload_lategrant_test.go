package redisstore_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
	"github.com/fair-queue/caddy-fair-queue/fairqueue/memstore"
	"github.com/fair-queue/caddy-fair-queue/internal/redistest"
)

// TestLocalFallbackDoesNotRunARedisGrantBesideTheUncountedLocalPermits,
// with a reload that sets on_store_error fail_closed once the requeue
// runs on a local permit: the fallback queue's permit still runs,
// uncounted in Redis until the next heartbeat, whatever the policy now.
// The waiter Redis grants meanwhile ran beside it: 3 at once on an
// upstream of permits 2.
func TestARedisGrantAfterAReloadThatDroppedTheFallbackDoesNotRunBesideTheUncountedLocalPermits(t *testing.T) {
	t.Parallel() // its own redis-server: it waits on it, not on the CPU
	srv := redistest.Start(t)
	const name = "fbreloadlategrant"
	// Long poll and lease: no heartbeat or reconcile runs while Redis is
	// frozen or until the test is done.
	nd := newNode(t, srv, name, fairqueue.Config{Permits: 2, Fallback: memstore.New(),
		Lease: 3 * time.Minute, PollInterval: 30 * time.Second, MaxWait: 40 * time.Second})
	var load upstreamLoad
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	a, err := nd.q.Acquire(ctx, fairqueue.Request{})
	require.NoError(t, err)
	load.start()
	c, err := nd.q.Acquire(ctx, fairqueue.Request{})
	require.NoError(t, err)
	load.start()

	queued := make(chan struct{})
	var once sync.Once
	waiter := make(chan acquired, 1)
	go func() {
		p, err := nd.q.Acquire(ctx, fairqueue.Request{OnQueued: func(fairqueue.Waiting) { once.Do(func() { close(queued) }) }})
		if err == nil {
			load.start()
		}
		waiter <- acquired{p: p, err: err}
	}()
	select {
	case <-queued:
	case r := <-waiter:
		t.Fatalf("the third request was answered with both permits held: %v", r.err)
	}

	srv.Freeze()
	load.end() // a's upstream refused it: it waits again
	ra, err := a.Requeue(ctx, -1)
	srv.Thaw()
	require.NoError(t, err, "the requeue Redis did not answer")
	load.start()
	require.True(t, ra.Local(), "the requeue waited again in the fallback queue")

	closed := nd.q.Config()
	closed.Fallback = nil
	require.NoError(t, nd.q.Reconfigure(closed))

	// The requeue's late release (or the give-back of its new ticket)
	// frees a's permit in Redis: Redis grants the waiter.
	rdb := srv.Client(t)
	eventually(t, 10*time.Second, func() bool { return len(readState(t, rdb, name).Waiting) == 0 },
		"the waiter never left Redis' queue")
	var got *acquired
	select {
	case r := <-waiter:
		got = &r
	case <-time.After(3 * time.Second):
	}
	assert.LessOrEqual(t, load.most.Load(), int32(2), "requests ran at once on an upstream of permits 2")

	load.end()
	ra.Release()
	if got == nil {
		r := <-waiter
		got = &r
	}
	require.NoError(t, got.err, "the waiter, once a permit was free")
	load.end()
	got.p.Release()
	load.end()
	c.Release()
	assert.LessOrEqual(t, load.most.Load(), int32(2), "requests ran at once on an upstream of permits 2")
}
