package redisstore_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
	"github.com/fair-queue/caddy-fair-queue/fairqueue/redisstore"
	"github.com/fair-queue/caddy-fair-queue/internal/redistest"
)

// TestHeartbeatEveryThirdOfTheLease reads a node's liveness expiry in
// Redis (each heartbeat writes Redis' time + the lease) while the node
// idles with a poll_interval longer than a third of its lease, so that
// its loop ticks every lease/3. A heartbeat is due every lease/3: the
// node renews its leases with two thirds of a lease to spare, and a
// pause (GC, a starved CPU, a slow Redis) shorter than that loses
// nothing. Counted: the renewals in 7 lease/3 periods.
//
// Seen before: the loop took the end of the last heartbeat for its
// time, so at the next tick (lease/3 after the last) the next one was
// not quite due: heartbeats every 2 x lease/3.
func TestHeartbeatEveryThirdOfTheLease(t *testing.T) {
	if testing.Short() {
		t.Skip("about 7s: skipped with -short")
	}
	srv := redistest.Start(t)
	rdb := srv.Client(t)
	const lease = 3 * time.Second
	n := newNode(t, srv, "cadence", fairqueue.Config{Permits: 1, MaxWait: 5 * time.Second, Lease: lease, PollInterval: 2 * time.Second})
	p, err := n.q.Acquire(context.Background(), fairqueue.Request{}) // joins
	require.NoError(t, err)
	p.Release()
	key := redisstore.New(rdb, "cadence", redisstore.Options{}).Tag() + ":nodes"
	node := readState(t, rdb, "cadence").Nodes
	require.Len(t, node, 1)

	renewals, last := 0, 0.0
	for end := time.Now().Add(7 * lease / 3); time.Now().Before(end); time.Sleep(20 * time.Millisecond) {
		exp, err := rdb.ZScore(context.Background(), key, node[0]).Result()
		require.NoError(t, err)
		if last != 0 && exp != last {
			renewals++
		}
		last = exp
	}
	// 7 due (one may fall just past the end); skipping every other
	// tick, 4 or 5.
	assert.GreaterOrEqual(t, renewals, 6, "heartbeats in 7 x lease/3")
}
