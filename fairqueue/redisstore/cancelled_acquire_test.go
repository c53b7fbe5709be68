package redisstore_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
	"github.com/fair-queue/caddy-fair-queue/fairqueue/redisstore"
	"github.com/fair-queue/caddy-fair-queue/internal/redistest"
)

// A request whose caller has left before it reaches the store (an
// HTTP/2 stream reset just after its body, by the thousand in a reset
// flood) costs the store nothing: no acquire, and no cancel leaving a
// tombstone in Redis for TombstoneTTL (before: the acquire failed at
// once on the ended context, and its cancel ran in the background and
// left the ticket's tombstone for 30 s).
func TestAnAcquireWhoseCallerHasLeftLeavesNothingInRedis(t *testing.T) {
	srv := redistest.Start(t)
	rdb := srv.Client(t)
	cfg := fairqueue.Config{Permits: 2, MaxWait: 10 * time.Second}
	q := openQueue(t, rdb, "left-before", cfg)
	other := openQueue(t, rdb, "left-before", cfg) // keeps the queue's keys once q leaves
	ctx := context.Background()
	for _, n := range []*fairqueue.Queue{q, other} { // both nodes joined
		p, err := n.Acquire(ctx, fairqueue.Request{})
		require.NoError(t, err)
		t.Cleanup(p.Release)
	}

	gone, cancel := context.WithCancel(ctx)
	cancel()
	p, err := q.Acquire(gone, fairqueue.Request{})
	require.Nil(t, p)
	require.ErrorIs(t, err, context.Canceled)
	require.NoError(t, q.Close()) // its calls in the background are done

	tag := redisstore.New(rdb, "left-before", redisstore.Options{}).Tag()
	marks, err := rdb.ZRange(ctx, tag+":gone", 0, -1).Result()
	require.NoError(t, err)
	var tickets []string
	for _, m := range marks {
		if strings.Contains(m, ":") { // a ticket's ID; a node's has no colon
			tickets = append(tickets, m)
		}
	}
	assert.Empty(t, tickets, "tombstones in Redis of a request that never reached it")
}
