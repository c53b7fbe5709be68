package redisstore_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
	"github.com/fair-queue/caddy-fair-queue/fairqueue/redisstore"
	"github.com/fair-queue/caddy-fair-queue/internal/redistest"
)

// Two queues share a client and a prefix, one with the default
// DeadQueueAfter (a look a minute) whose heartbeat comes first, one with
// 500 ms: the short one's heartbeats still look for dead queues at its
// own pace (an eighth of a second), not the other's minute.
func TestAShortDeadQueueAfterSweepsAtItsOwnPaceBesideALongOne(t *testing.T) {
	ctx := context.Background()
	srv := redistest.Start(t)
	rdb := srv.Client(t)
	short := redisstore.Options{DeadQueueAfter: 500 * time.Millisecond}
	crashQueue(t, rdb, "gone", short)
	gone := redisstore.TagOf("", "gone") + "*"

	long := redisstore.New(rdb, "main", redisstore.Options{})
	require.NoError(t, long.Open(ctx, "n1", nopListener{}))
	t.Cleanup(func() { _ = long.Close() })
	l := fairqueue.Limits{Permits: 1, Lease: time.Minute}
	// The process' first heartbeat under the prefix: its looks start.
	_, err := long.Heartbeat(ctx, fairqueue.HeartbeatArgs{Node: "n1", Limits: l, Beat: 1})
	require.NoError(t, err)

	q, err := fairqueue.New(redisstore.New(rdb, "live", short), fairqueue.Config{Name: "live", Permits: 1, Lease: time.Second})
	require.NoError(t, err)
	t.Cleanup(func() { _ = q.Close() })
	p, err := q.Acquire(ctx, fairqueue.Request{})
	require.NoError(t, err)
	defer p.Release()
	// The crashed queue's lease ends in 300 ms, then 500 ms dead; the
	// live queue heartbeats every third of a second: 15 s is slack.
	eventually(t, 15*time.Second, func() bool { return len(srv.Keys(t, gone)) == 0 },
		"the crashed queue's keys are still there: %v", srv.Keys(t, gone))
}
