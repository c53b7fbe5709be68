package redisstore_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
	"github.com/fair-queue/caddy-fair-queue/fairqueue/memstore"
	"github.com/fair-queue/caddy-fair-queue/internal/redistest"
)

// Local fallback, fair queueing with max_in_flight_per_tenant 1: a
// tenant whose request Redis granted still runs at the outage is at its
// cap in the fallback queue too. Its request that waited in Redis for
// that cap, moved into the fallback queue, waits there until the running
// one ends (it was granted at once beside it: 2 at once for a cap of
// 1), and so does its request that comes during the outage; another
// tenant's is served.
func TestLocalFallbackCountsTheRunningRequestsForTheirTenant(t *testing.T) {
	t.Parallel() // its own redis-server: it waits on it, not on the CPU
	srv := redistest.Start(t)
	n := newNode(t, srv, "fbruntenant", fairqueue.Config{Permits: 4, Fair: true, MaxInFlightPerTenant: 1,
		Fallback: memstore.New(), Lease: 30 * time.Second, PollInterval: 50 * time.Millisecond, MaxWait: 20 * time.Second})
	ctx := context.Background()
	running, err := n.q.Acquire(ctx, fairqueue.Request{Tenant: "a"})
	require.NoError(t, err)
	require.False(t, running.Local())

	// Tenant a's second request waits in Redis for the cap.
	queued := make(chan struct{}, 2)
	type result struct {
		p   *fairqueue.Permit
		err error
	}
	second := make(chan result, 1)
	go func() {
		p, err := n.q.Acquire(ctx, fairqueue.Request{Tenant: "a", OnQueued: func(fairqueue.Waiting) { queued <- struct{}{} }})
		second <- result{p, err}
	}()
	select {
	case <-queued:
	case <-time.After(10 * time.Second):
		t.Fatal("tenant a's second request never queued in Redis")
	}

	srv.Kill()
	eventually(t, 10*time.Second, func() bool { return !n.q.Stats().StoreUp }, "Redis never marked down")
	// Moved into the fallback queue, it queues there: tenant a's request
	// still runs.
	select {
	case <-queued:
	case r := <-second:
		if r.p != nil {
			r.p.Release()
		}
		t.Fatalf("tenant a's waiter moved into the fallback queue was answered beside its running request (cap 1): local %v, err %v",
			r.p != nil && r.p.Local(), r.err)
	case <-time.After(10 * time.Second):
		t.Fatal("tenant a's waiter never queued in the fallback queue")
	}
	// A newcomer of tenant a waits too (its max wait runs out); tenant b's is served.
	_, err = n.q.Acquire(ctx, fairqueue.Request{Tenant: "a", MaxWait: 300 * time.Millisecond})
	var rej *fairqueue.RejectError
	require.True(t, errors.As(err, &rej), "tenant a's newcomer during the outage: %v", err)
	assert.Equal(t, fairqueue.ReasonTimeout, rej.Reason)
	b, err := n.q.Acquire(ctx, fairqueue.Request{Tenant: "b"})
	require.NoError(t, err)
	assert.True(t, b.Local())
	b.Release()

	// The running request ends: tenant a's waiter gets its permit.
	running.Release()
	select {
	case r := <-second:
		require.NoError(t, r.err)
		assert.True(t, r.p.Local())
		r.p.Release()
	case <-time.After(10 * time.Second):
		t.Fatal("tenant a's waiter was not served once its running request ended")
	}
}
