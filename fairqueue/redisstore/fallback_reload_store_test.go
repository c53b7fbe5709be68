package redisstore_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
	"github.com/fair-queue/caddy-fair-queue/fairqueue/memstore"
	"github.com/fair-queue/caddy-fair-queue/internal/redistest"
)

// docs/library.md, Config.Fallback: a library user's Reconfigure that
// passes another fallback store (memstore.New() anew at each reload)
// while a fallback queue of an outage past still has a permit running
// must not open the next outage's fallback queue on the new store, which
// does not count that permit: it granted its local permits beside it.
// Permits 1, local_permits 1: the first outage's local request runs on
// (Redis counts it once back); the reload passes a new memstore; in the
// second outage no request runs beside it.
func TestAReloadWithAnotherFallbackStoreStillCountsThePermitsOfTheFallbackQueueBefore(t *testing.T) {
	t.Parallel() // its own redis-server: it waits on it, not on the CPU
	srv := redistest.Start(t)
	const name = "fbreloadstore"
	cfg := fairqueue.Config{Permits: 1, LocalPermits: 1, Fallback: memstore.New(), Lease: 30 * time.Second,
		PollInterval: 50 * time.Millisecond, MaxWait: 20 * time.Second}
	nd := newNode(t, srv, name, cfg)
	p, err := nd.q.Acquire(context.Background(), fairqueue.Request{})
	require.NoError(t, err) // joined
	p.Release()
	srv.Kill()
	waitDown(t, nd)
	local, err := nd.q.Acquire(context.Background(), fairqueue.Request{})
	require.NoError(t, err)
	require.True(t, local.Local(), "the first outage's request runs on its fallback queue")
	defer local.Release()

	// A waiter of the first fallback queue: once Redis is back it moves
	// into Redis's queue as that fallback queue retires, with local
	// still running on it.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	waiter := make(chan error, 1)
	go func() {
		p, err := nd.q.Acquire(ctx, fairqueue.Request{})
		if p != nil {
			p.Release()
		}
		waiter <- err
	}()
	eventually(t, 10*time.Second, func() bool { return nd.q.Stats().Waiting == 1 }, "the waiter never queued in the fallback queue")
	srv.Restart()
	eventually(t, 20*time.Second, func() bool {
		st := readState(t, nd.rdb, name)
		return len(st.Holders) == 1 && len(st.Waiting) == 1
	}, "the local request was never counted by Redis, its fallback queue's waiter never moved there")
	cancel()
	select {
	case err := <-waiter:
		require.ErrorIs(t, err, context.Canceled)
	case <-time.After(10 * time.Second):
		t.Fatal("the waiter never left")
	}

	reloaded := nd.q.Config()
	reloaded.Fallback = memstore.New()
	require.NoError(t, nd.q.Reconfigure(reloaded))

	// The second outage: local still runs, on permits 1.
	srv.Kill()
	waitDown(t, nd)
	if p := tryAcquire(t, nd, fairqueue.Request{}, time.Second); p != nil {
		p.Release()
		t.Fatalf("a request of the second outage ran (local %v) beside the first outage's local request: 2 at once on permits 1", p.Local())
	}
	local.Release()
	p = tryAcquire(t, nd, fairqueue.Request{}, 10*time.Second)
	require.NotNil(t, p, "no request of the second outage served once the first outage's local request ended")
	defer p.Release()
	assert.True(t, p.Local(), "served by the second outage's fallback queue")
}
