package redisstore_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
	"github.com/fair-queue/caddy-fair-queue/internal/redistest"
)

// The last instance shuts down (Close) while Redis is frozen (SIGSTOP):
// every waiter is answered shutting_down, and Close returns, within the
// store's timeouts. The leave cannot reach Redis: once thawed, Redis
// holds the instance's entries as a killed instance's (docs/failures.md),
// until the queue's next last instance leaves.
func TestCloseOnAFrozenRedisAnswersEveryWaiter(t *testing.T) {
	t.Parallel() // its own redis-server: it waits on it, not on the CPU
	srv := redistest.Start(t)
	const name = "closefrozen"
	cfg := fairqueue.Config{Permits: 1, Lease: 3 * time.Second, StoreTimeout: 300 * time.Millisecond,
		PollInterval: 50 * time.Millisecond, MaxWait: time.Minute}
	n := newNode(t, srv, name, cfg)
	held, err := n.q.Acquire(context.Background(), fairqueue.Request{})
	require.NoError(t, err)
	const waiters = 3
	answered := make(chan error, waiters)
	for i := range waiters {
		go func() {
			p, err := n.q.Acquire(context.Background(), fairqueue.Request{})
			if err == nil {
				p.Release()
			}
			answered <- err
		}()
		eventually(t, 10*time.Second, func() bool {
			return len(readState(t, srv.Client(t), name).Waiting) == i+1
		}, "waiter %d queued", i+1)
	}

	srv.Freeze()
	thawed := false
	t.Cleanup(func() {
		if !thawed {
			srv.Thaw()
		}
	})
	closed := make(chan error, 1)
	go func() { closed <- n.q.Close() }()
	for range waiters {
		select {
		case err := <-answered:
			var rej *fairqueue.RejectError
			require.True(t, errors.As(err, &rej), "not a reject: %v", err)
			assert.Equal(t, fairqueue.ReasonShuttingDown, rej.Reason)
		case <-time.After(20 * time.Second):
			t.Fatal("a waiter was not answered while Redis is frozen")
		}
	}
	select {
	case <-closed: // its leave may have failed: Redis is frozen
	case <-time.After(30 * time.Second):
		t.Fatal("Close did not return while Redis is frozen")
	}
	held.Release() // after the leave: the node released it

	srv.Thaw()
	thawed = true
	// The leave met the frozen Redis and did not run: the instance's
	// entries stay, as a killed instance's do. Its permit comes back
	// within its lease, its waiters are dropped, and the leave of the
	// queue's next last instance deletes every key.
	b := newNode(t, srv, name, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), 3*cfg.Lease)
	defer cancel()
	p, err := b.q.Acquire(ctx, fairqueue.Request{})
	require.NoError(t, err, "the permit of the instance that left on a frozen Redis never came back")
	p.Release()
	require.NoError(t, b.q.Close())
	assert.Empty(t, srv.Keys(t, "*"), "keys left after the next last instance left")
}
