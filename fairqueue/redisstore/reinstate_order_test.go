package redisstore_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
	"github.com/fair-queue/caddy-fair-queue/fairqueue/redisstore"
	"github.com/fair-queue/caddy-fair-queue/internal/redistest"
)

// Waiters a node queues again after Redis lost them go to the tail, but
// among themselves in the order they arrived: a node's earlier request
// is not served after its later ones. Lost by an eviction of the queue's
// keys (DEL, as an eviction does), or by a partition longer than the
// lease: another node's reconcile forgets the silent node and drops its
// waiters, which it queues again once back.
func TestWaitersQueuedAgainKeepTheirOrder(t *testing.T) {
	for _, tc := range []struct {
		name string
		fair bool
		lose func(t *testing.T, a *node, cut *atomic.Bool)
	}{
		{"fifo evicted", false, evict("waiting")},
		{"fair evicted", true, evict("fwait", "fticket")},
		{"fifo partitioned", false, partition},
	} {
		t.Run(tc.name, func(t *testing.T) { queuedAgainInOrder(t, tc.fair, tc.lose) })
	}
}

const reorderWaiters = 16

func queuedAgainInOrder(t *testing.T, fair bool, lose func(t *testing.T, a *node, cut *atomic.Bool)) {
	srv := redistest.Start(t)
	cfg := fairqueue.Config{Permits: 1, Lease: 1500 * time.Millisecond, PollInterval: 50 * time.Millisecond,
		MaxWait: 60 * time.Second, Fair: fair}
	a := newNode(t, srv, "reorder", cfg)
	var cut atomic.Bool
	b := wrappedNode(t, srv, "reorder", cfg, func(s fairqueue.Store) fairqueue.Store { return cutLink{s, &cut} })
	p, err := a.q.Acquire(context.Background(), fairqueue.Request{})
	require.NoError(t, err)

	served := make(chan int, reorderWaiters)
	errs := make(chan error, reorderWaiters)
	for i := range reorderWaiters {
		go func() {
			w, err := b.q.Acquire(context.Background(), fairqueue.Request{})
			if err != nil {
				errs <- err
				return
			}
			served <- i
			w.Release()
		}()
		eventually(t, 5*time.Second, func() bool { return len(readState(t, a.rdb, "reorder").Waiting) == i+1 },
			"waiter %d not queued", i)
	}
	time.Sleep(cfg.Lease) // heartbeats pass with every waiter queued
	lose(t, a, &cut)
	p.Release()

	assertServedInOrder(t, served, errs, reorderWaiters, "the node's waiters, queued again, served out of their arrival order")
}

// assertServedInOrder takes the numbers of n waiters from served as each
// is granted (a waiter's error from errs fails the test) and checks they
// came 0, 1, ... n-1.
func assertServedInOrder(t *testing.T, served <-chan int, errs <-chan error, n int, msg string) {
	t.Helper()
	var order []int
	for len(order) < n {
		select {
		case i := <-served:
			order = append(order, i)
		case err := <-errs:
			t.Fatalf("a waiter failed: %v", err)
		case <-time.After(20 * time.Second):
			t.Fatalf("only %v served within 20s", order)
		}
	}
	want := make([]int, n)
	for i := range want {
		want[i] = i
	}
	assert.Equal(t, want, order, msg)
}

// evict deletes the queue's keys, then waits for b's waiters to be
// queued again.
func evict(keys ...string) func(t *testing.T, a *node, cut *atomic.Bool) {
	return func(t *testing.T, a *node, _ *atomic.Bool) {
		tag := redisstore.New(a.rdb, "reorder", redisstore.Options{}).Tag()
		for _, k := range keys {
			require.NoError(t, a.rdb.Del(context.Background(), tag+":"+k).Err())
		}
		eventually(t, 10*time.Second, func() bool { return len(readState(t, a.rdb, "reorder").Waiting) == reorderWaiters },
			"the lost waiters were not queued again")
	}
}

// partition cuts b's heartbeats and reconciles until a's reconcile
// (a waits too: it reconciles) has dropped b's waiters, then heals it
// and waits for them to be queued again, behind a's.
func partition(t *testing.T, a *node, cut *atomic.Bool) {
	aw := acquireAsync(a, context.Background())
	eventually(t, 5*time.Second, func() bool { return len(readState(t, a.rdb, "reorder").Waiting) == reorderWaiters+1 },
		"a's waiter not queued")
	cut.Store(true)
	eventually(t, 10*time.Second, func() bool { return len(readState(t, a.rdb, "reorder").Waiting) == 1 },
		"the silent node's waiters were not dropped")
	cut.Store(false)
	eventually(t, 10*time.Second, func() bool { return len(readState(t, a.rdb, "reorder").Waiting) == reorderWaiters+1 },
		"the dropped waiters were not queued again")
	go func() {
		if r := <-aw; r.err == nil {
			r.p.Release()
		}
	}()
}

// cutLink fails a node's heartbeats and reconciles while cut is set: the
// node is silent, as in a partition, and Redis forgets it.
type cutLink struct {
	fairqueue.Store
	cut *atomic.Bool
}

var errCut = errors.New("cut off")

func (c cutLink) Heartbeat(ctx context.Context, hb fairqueue.HeartbeatArgs) (fairqueue.HeartbeatResult, error) {
	if c.cut.Load() {
		return fairqueue.HeartbeatResult{}, errCut
	}
	return c.Store.Heartbeat(ctx, hb)
}

func (c cutLink) Reconcile(ctx context.Context, node string, l fairqueue.Limits) (fairqueue.ReconcileResult, error) {
	if c.cut.Load() {
		return fairqueue.ReconcileResult{}, errCut
	}
	return c.Store.Reconcile(ctx, node, l)
}
