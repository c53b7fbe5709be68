package redisstore_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
	"github.com/fair-queue/caddy-fair-queue/fairqueue/memstore"
	"github.com/fair-queue/caddy-fair-queue/internal/redistest"
)

// waitDown acquires through nd until it has marked Redis down, releasing
// whatever it got.
func waitDown(t *testing.T, nd *node) {
	t.Helper()
	eventually(t, 10*time.Second, func() bool {
		if p := tryAcquire(t, nd, fairqueue.Request{}, 100*time.Millisecond); p != nil {
			p.Release()
		}
		return !nd.q.Stats().StoreUp
	}, "Redis never marked down")
}

// A second outage counts the requests Redis granted that run at its
// start in every fallback queue on the node's fallback store, also in
// that of the first outage, retired with a local permit still running:
// that permit's end hands the fallback store's permits on under the
// same limits as the new fallback queue. One instance of `permits 2`:
// the first outage's local request runs on, Redis grants a second one,
// Redis goes away again with both running; when the local one ends,
// one waiter of the second outage runs, not two beside the one Redis
// granted.
func TestLocalFallbackOfASecondOutageCountsTheRequestsRunningThen(t *testing.T) {
	t.Parallel() // its own redis-server: it waits on it, not on the CPU
	srv := redistest.Start(t)
	cfg := fairqueue.Config{Permits: 2, Fallback: memstore.New(), Lease: 30 * time.Second,
		PollInterval: 50 * time.Millisecond, MaxWait: 10 * time.Second}
	nd := newNode(t, srv, "fbsecond", cfg)
	p, err := nd.q.Acquire(context.Background(), fairqueue.Request{})
	require.NoError(t, err) // joined
	p.Release()
	srv.Kill()
	waitDown(t, nd)
	local, err := nd.q.Acquire(context.Background(), fairqueue.Request{})
	require.NoError(t, err)
	require.True(t, local.Local(), "the first outage's request runs on its fallback queue")
	defer local.Release()

	// Redis is back: the local request is adopted, the fallback queue
	// retires with it running, and Redis grants the second permit.
	srv.Restart()
	eventually(t, 15*time.Second, func() bool {
		return nd.q.Stats().StoreUp && len(readState(t, nd.rdb, "fbsecond").Holders) == 1
	}, "the local request was never adopted once Redis was back")
	var granted *fairqueue.Permit
	eventually(t, 15*time.Second, func() bool {
		p := tryAcquire(t, nd, fairqueue.Request{}, 200*time.Millisecond)
		if p != nil && p.Local() {
			p.Release()
			return false
		}
		granted = p
		return p != nil
	}, "Redis never granted the second permit once back")
	defer granted.Release()
	if p := tryAcquire(t, nd, fairqueue.Request{}, time.Second); p != nil {
		p.Release()
		t.Fatalf("Redis granted a third request beside the adopted local one and its own (local %v)", p.Local())
	}

	// The second outage: both still run.
	srv.Kill()
	waitDown(t, nd)
	type result struct {
		p   *fairqueue.Permit
		err error
	}
	got := make(chan result, 2)
	queued := make(chan struct{}, 2)
	for range 2 {
		go func() {
			p, err := nd.q.Acquire(context.Background(), fairqueue.Request{
				OnQueued: func(fairqueue.Waiting) { queued <- struct{}{} }})
			got <- result{p, err}
		}()
	}
	for range 2 {
		select {
		case <-queued:
		case r := <-got:
			if r.p != nil {
				r.p.Release()
			}
			t.Fatalf("a request of the second outage ran (or failed: %v) beside the 2 still running, for permits 2", r.err)
		case <-time.After(10 * time.Second):
			t.Fatal("the second outage's requests never queued")
		}
	}

	// The first outage's request ends: one permit is free, not two.
	local.Release()
	var first result
	select {
	case first = <-got:
	case <-time.After(5 * time.Second):
		t.Fatal("the permit the local request freed was not given")
	}
	require.NoError(t, first.err)
	defer first.p.Release()
	select {
	case r := <-got:
		if r.p != nil {
			defer r.p.Release()
		}
		t.Fatalf("a second waiter ran (err %v) beside the first and the request Redis granted, still running: 3 requests at once for permits 2", r.err)
	case <-time.After(time.Second):
	}
	granted.Release()
	select {
	case r := <-got:
		require.NoError(t, r.err, "the permit the Redis request freed")
		r.p.Release()
	case <-time.After(5 * time.Second):
		t.Fatal("the permit the Redis request freed was not given")
	}
}
