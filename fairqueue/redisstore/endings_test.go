package redisstore_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
	"github.com/fair-queue/caddy-fair-queue/internal/redistest"
)

// Close answers the node's waiters and leaves: "nothing of this node stays
// in the store", and the last node out deletes the queue's keys. A waiter
// Close rejected counts as gone for Close as soon as its state moved, while
// its cancel is still on its way: the leave can reach Redis first, and
// where nothing dispatches the dead node's waiter (its pool's upstream
// cools) the waiter, and with it every key of the queue, stays. (The
// caller then closes the client: the late cancel fails.)
func TestCloseWaitsForTheCancelsOfTheWaitersItRejects(t *testing.T) {
	srv := redistest.Start(t)
	s := &slowCancel{}
	cfg := fairqueue.Config{Permits: 1, MaxWait: 10 * time.Second,
		Upstreams: []fairqueue.Upstream{{Dial: "a:1", Permits: 1}}}
	n := wrappedNode(t, srv, "closecancel", cfg, func(st fairqueue.Store) fairqueue.Store { s.Store = st; return s })
	p, err := n.q.Acquire(context.Background(), fairqueue.Request{})
	require.NoError(t, err)
	waiter := acquireAsync(n, context.Background())
	eventually(t, 5*time.Second, func() bool { return len(readState(t, n.rdb, "closecancel").Waiting) == 1 }, "never queued")
	p.Cool(time.Minute) // its upstream failed it: nothing is granted on it for a minute
	p.Release()
	time.Sleep(100 * time.Millisecond)
	require.Len(t, readState(t, n.rdb, "closecancel").Waiting, 1)

	require.NoError(t, n.q.Close())
	got := <-waiter
	require.ErrorIs(t, got.err, fairqueue.ErrShuttingDown)
	_ = n.rdb.Close() // as the caller does once Close returns
	assert.Empty(t, srv.Keys(t, "*"), "keys left after the last node left")
}
