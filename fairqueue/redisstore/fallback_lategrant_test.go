package redisstore_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
	"github.com/fair-queue/caddy-fair-queue/fairqueue/memstore"
	"github.com/fair-queue/caddy-fair-queue/internal/redistest"
)

// upstreamLoad counts the requests running on the upstream at once, and
// the most it ever saw.
type upstreamLoad struct {
	now, most atomic.Int32
}

func (u *upstreamLoad) start() {
	n := u.now.Add(1)
	for {
		m := u.most.Load()
		if n <= m || u.most.CompareAndSwap(m, n) {
			return
		}
	}
}

func (u *upstreamLoad) end() { u.now.Add(-1) }

// A Redis grant the instance reads while it still serves from its
// fallback queue (Redis answers again, but the heartbeat that has it
// count the local permits has not run yet) would run beside those local
// permits, uncounted in Redis: the upstream above its permits. Here a
// frozen Redis fails the requeue of one of the two requests it granted
// (`permits 2`), which waits again in the fallback queue and runs on a
// local permit; Redis thaws, and the requeue's late release hands the
// freed permit to the instance's waiter still queued there. That waiter
// waits instead (the fallback queue, then Redis' queue), and runs once
// one of the two ends: never three at once.
func TestLocalFallbackDoesNotRunARedisGrantBesideTheUncountedLocalPermits(t *testing.T) {
	t.Parallel() // its own redis-server: it waits on it, not on the CPU
	srv := redistest.Start(t)
	// Long poll and lease: no heartbeat or reconcile runs while Redis is
	// frozen or until the test is done (the requeue's failure is the only
	// one, and the store is never marked down).
	nd := newNode(t, srv, "fblategrant", fairqueue.Config{Permits: 2, Fallback: memstore.New(),
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
	require.False(t, a.Local() || c.Local(), "granted by Redis")

	type result struct {
		p   *fairqueue.Permit
		err error
	}
	queued := make(chan struct{})
	var once sync.Once
	waiter := make(chan result, 1)
	go func() {
		p, err := nd.q.Acquire(ctx, fairqueue.Request{OnQueued: func(fairqueue.Waiting) { once.Do(func() { close(queued) }) }})
		if err == nil {
			load.start()
		}
		waiter <- result{p, err}
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

	// The requeue's late release (or the give-back of its new ticket)
	// frees a's permit in Redis: Redis grants the waiter.
	rdb := srv.Client(t)
	eventually(t, 10*time.Second, func() bool { return len(readState(t, rdb, "fblategrant").Waiting) == 0 },
		"the waiter never left Redis' queue")
	var got *result
	select {
	case r := <-waiter: // its Redis grant, read beside the local permit
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
