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

// A requeue that reaches a Redis which lost its data (a restart without
// persistence, a failover to an empty replica, FLUSHALL) still cools the
// upstream that refused the request: the old ticket is not found as a
// holder there, yet the upstream refused it all the same. The cooldown
// went only with the removal of a holder Redis knew: the new ticket was
// granted at once on the upstream that had just refused it, the other
// being free.
func TestRequeueAfterDataLossCoolsTheRefusingUpstream(t *testing.T) {
	rdb, s := openStore(t, "requeueflushcool")
	ctx := context.Background()
	l := fairqueue.Limits{Permits: 2, Lease: 30 * time.Second,
		Upstreams: []fairqueue.Upstream{{Dial: "a:1", Permits: 1}, {Dial: "b:1", Permits: 1}}}
	r, err := s.Acquire(ctx, fairqueue.TicketArgs{ID: "n1:1", Node: "n1", Limits: l})
	require.NoError(t, err)
	require.True(t, r.Granted)
	require.Equal(t, "a:1", r.Upstream, "both free: the first of the pool")
	require.NoError(t, rdb.FlushAll(ctx).Err())

	r, err = s.Requeue(ctx, fairqueue.RequeueArgs{Old: "n1:1", Seq: r.Seq,
		TicketArgs: fairqueue.TicketArgs{ID: "n1:2", Node: "n1", Limits: l, Cost: 1, Correction: -1,
			Cool: "a:1", CoolFor: 30 * time.Second}})
	require.NoError(t, err)
	// A grant the requeue's dispatch makes goes to the node's Listener;
	// the store's snapshot tells where it runs.
	snap, err := s.Inspect(ctx, 10, 0)
	require.NoError(t, err)
	require.Len(t, snap.Holders, 1, "b is free: the requeued ticket holds a permit")
	assert.Equal(t, "b:1", snap.Holders[0].Upstream, "a refused the request and cools: the requeued ticket runs on b")

	// The cooldown is Redis's, for every later grant: with b busy, a
	// newcomer waits.
	r, err = s.Acquire(ctx, fairqueue.TicketArgs{ID: "n1:3", Node: "n1", Limits: l})
	require.NoError(t, err)
	assert.False(t, r.Granted, "a cools, b runs n1:2: granted on %q", r.Upstream)
}

// The same through a Queue: a permit held on upstream a, Redis loses its
// data, the request is requeued (a answered 429/503): it runs on b, and
// a, cooling, takes no request while the cooldown lasts.
func TestQueueRequeueAfterDataLossDoesNotGrantTheCoolingUpstream(t *testing.T) {
	srv := redistest.Start(t)
	cfg := fairqueue.Config{Permits: 2, Lease: 30 * time.Second, PollInterval: 50 * time.Millisecond,
		MaxWait:   10 * time.Second,
		Upstreams: []fairqueue.Upstream{{Dial: "u1:1", Permits: 1}, {Dial: "u2:1", Permits: 1}}}
	nd := newNode(t, srv, "requeueflushcoolq", cfg)
	ctx := context.Background()
	p, err := nd.q.Acquire(ctx, fairqueue.Request{})
	require.NoError(t, err)
	refused := p.Upstream()
	require.Equal(t, "u1:1", refused, "both free: the first of the pool")
	require.NoError(t, srv.Client(t).FlushAll(ctx).Err())

	rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	r, err := p.Requeue(rctx, 30*time.Second)
	require.NoError(t, err)
	defer r.Release()
	assert.NotEqual(t, refused, r.Upstream(), "granted again on the upstream that refused it, which cools, while the other was free")

	// The other upstream busy, a cooling: a newcomer gets nothing.
	if q := tryAcquire(t, nd, fairqueue.Request{}, time.Second); q != nil {
		q.Release()
		t.Fatalf("granted on %q while %q cools and the requeued request runs on %q", q.Upstream(), refused, r.Upstream())
	}
}
