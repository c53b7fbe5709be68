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

// Waiters a node queues again after Redis lost them (an eviction of the
// waiting key here; a partition longer than the lease, whose forgotten
// node's waiters are dropped, takes the same path) go to the tail, but
// among themselves in the order they arrived: a node's earlier request
// is not served after its later ones.
func TestWaitersQueuedAgainKeepTheirOrder(t *testing.T) {
	for _, tc := range []struct {
		name string
		fair bool
		keys []string
	}{
		{"fifo", false, []string{"waiting"}},
		{"fair", true, []string{"fwait", "fticket"}},
	} {
		t.Run(tc.name, func(t *testing.T) { queuedAgainInOrder(t, tc.fair, tc.keys) })
	}
}

func queuedAgainInOrder(t *testing.T, fair bool, keys []string) {
	const n = 8
	srv := redistest.Start(t)
	cfg := fairqueue.Config{Permits: 1, Lease: 1500 * time.Millisecond, PollInterval: 50 * time.Millisecond,
		MaxWait: 60 * time.Second, Fair: fair}
	a := newNode(t, srv, "reorder", cfg)
	b := newNode(t, srv, "reorder", cfg)
	p, err := a.q.Acquire(context.Background(), fairqueue.Request{})
	require.NoError(t, err)

	served := make(chan int, n)
	errs := make(chan error, n)
	for i := range n {
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

	tag := redisstore.New(a.rdb, "reorder", redisstore.Options{}).Tag()
	for _, k := range keys {
		require.NoError(t, a.rdb.Del(context.Background(), tag+":"+k).Err())
	}
	eventually(t, 10*time.Second, func() bool { return len(readState(t, a.rdb, "reorder").Waiting) == n },
		"the lost waiters were not queued again")
	p.Release()

	var order []int
	for range n {
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
	assert.Equal(t, want, order, "the node's waiters, queued again, served out of their arrival order")
}
