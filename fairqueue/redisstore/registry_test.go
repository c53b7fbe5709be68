package redisstore_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
	"github.com/fair-queue/caddy-fair-queue/fairqueue/redisstore"
	"github.com/fair-queue/caddy-fair-queue/internal/redistest"
)

// crashQueue leaves queue name in Redis as an instance that crashed
// would: a permit held and a waiter queued, its lease left to run out,
// no leave.
func crashQueue(t *testing.T, rdb *redis.Client, name string, opts redisstore.Options) {
	t.Helper()
	ctx := context.Background()
	s := redisstore.New(rdb, name, opts)
	require.NoError(t, s.Open(ctx, "doomed", nopListener{}))
	l := fairqueue.Limits{Permits: 1, Lease: 300 * time.Millisecond}
	r, err := s.Acquire(ctx, fairqueue.TicketArgs{ID: "doomed:1", Node: "doomed", Limits: l, Cost: 1})
	require.NoError(t, err)
	require.True(t, r.Granted)
	r, err = s.Acquire(ctx, fairqueue.TicketArgs{ID: "doomed:2", Node: "doomed", Limits: l, Cost: 1})
	require.NoError(t, err)
	require.False(t, r.Granted)
	require.NoError(t, s.Close()) // the subscription ends; no leave
}

// A queue whose instances all crashed, and that no instance opens again
// (a name from the request nobody sends any more), is deleted by the
// heartbeats of another queue's instance once nobody has been live in it
// for DeadQueueAfter; when the last instance stops, Redis holds nothing,
// the registry included.
func TestAQueueWhoseInstancesAllCrashedIsDeletedByAnotherQueuesHeartbeats(t *testing.T) {
	ctx := context.Background()
	srv := redistest.Start(t)
	rdb := srv.Client(t)
	opts := redisstore.Options{DeadQueueAfter: 500 * time.Millisecond}
	crashQueue(t, rdb, "gone", opts)
	gone := redisstore.TagOf("", "gone") + "*"
	require.NotEmpty(t, srv.Keys(t, gone))

	live := redisstore.New(rdb, "live", opts)
	n, err := live.SweepDead(ctx)
	require.NoError(t, err)
	assert.Zero(t, n, "a queue whose lease has not run out is not dead")
	require.NotEmpty(t, srv.Keys(t, gone))

	q, err := fairqueue.New(live, fairqueue.Config{Name: "live", Permits: 1, Lease: time.Second})
	require.NoError(t, err)
	p, err := q.Acquire(ctx, fairqueue.Request{})
	require.NoError(t, err)
	// The sweep deletes the queue's keys, then its registry entry: both.
	registered := func() []string {
		names, err := rdb.ZRange(ctx, redisstore.RegistryKey(""), 0, -1).Result()
		require.NoError(t, err)
		return names
	}
	eventually(t, 15*time.Second, func() bool { return len(srv.Keys(t, gone)) == 0 && !slices.Contains(registered(), "gone") },
		"the crashed queue's keys or registry entry are still there: %v %v", srv.Keys(t, gone), registered())
	assert.Equal(t, []string{"live"}, registered(), "the registry")

	p.Release()
	require.NoError(t, q.Close())
	assert.Empty(t, srv.Keys(t, "*"), "keys left after the last instance stopped")
}

// A queue the registry names late (its instances do not register, as an
// earlier version's) but that has a live instance keeps its keys, and is
// named again so the next sweeps do not look at it.
func TestSweepKeepsAQueueWithALiveInstance(t *testing.T) {
	ctx := context.Background()
	srv := redistest.Start(t)
	rdb := srv.Client(t)
	old := redisstore.New(rdb, "old", redisstore.Options{DeadQueueAfter: -1})
	require.NoError(t, old.Open(ctx, "n1", nopListener{}))
	t.Cleanup(func() { _ = old.Close() })
	l := fairqueue.Limits{Permits: 1, Lease: 10 * time.Second}
	_, err := old.Acquire(ctx, fairqueue.TicketArgs{ID: "n1:1", Node: "n1", Limits: l, Cost: 1})
	require.NoError(t, err)
	assert.Empty(t, srv.Keys(t, redisstore.RegistryKey("")), "a store with DeadQueueAfter -1 registers its queue")

	reg := redisstore.RegistryKey("")
	require.NoError(t, rdb.ZAdd(ctx, reg, redis.Z{Score: 1, Member: "old"}).Err())
	sweeper := redisstore.New(rdb, "other", redisstore.Options{DeadQueueAfter: 50 * time.Millisecond})
	time.Sleep(100 * time.Millisecond)
	n, err := sweeper.SweepDead(ctx)
	require.NoError(t, err)
	assert.Zero(t, n)
	assert.NotEmpty(t, srv.Keys(t, redisstore.TagOf("", "old")+":holders"), "the live queue's permit")
	score, err := rdb.ZScore(ctx, reg, "old").Result()
	require.NoError(t, err)
	assert.Greater(t, score, float64(time.Now().Add(-time.Minute).UnixMilli()), "named again")
}
