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

// A release that reaches a Redis which lost its data (a restart without
// persistence, a failover to an empty replica, FLUSHALL) still cools the
// upstream that failed the request: the ticket is not found as a holder
// there, yet the upstream failed it all the same. The cooldown went only
// with the removal of a holder Redis knew: the next request was granted
// at once on the upstream that had just failed, the other being free.
func TestReleaseAfterDataLossCoolsTheFailedUpstream(t *testing.T) {
	rdb, s := openStore(t, "releaseflushcool")
	ctx := context.Background()
	l := fairqueue.Limits{Permits: 2, Lease: 30 * time.Second,
		Upstreams: []fairqueue.Upstream{{Dial: "a:1", Permits: 1}, {Dial: "b:1", Permits: 1}}}
	r, err := s.Acquire(ctx, fairqueue.TicketArgs{ID: "n1:1", Node: "n1", Limits: l})
	require.NoError(t, err)
	require.True(t, r.Granted)
	require.Equal(t, "a:1", r.Upstream, "both free: the first of the pool")
	require.NoError(t, rdb.FlushAll(ctx).Err())

	require.NoError(t, s.Release(ctx, fairqueue.TicketArgs{ID: "n1:1", Node: "n1", Limits: l,
		Cool: "a:1", CoolFor: 30 * time.Second}))
	r, err = s.Acquire(ctx, fairqueue.TicketArgs{ID: "n1:2", Node: "n1", Limits: l})
	require.NoError(t, err)
	require.True(t, r.Granted, "b is free")
	assert.Equal(t, "b:1", r.Upstream, "a failed the request and cools: the next request runs on b")

	// With b busy, a cooling: a newcomer waits.
	r, err = s.Acquire(ctx, fairqueue.TicketArgs{ID: "n1:3", Node: "n1", Limits: l})
	require.NoError(t, err)
	assert.False(t, r.Granted, "a cools, b runs n1:2: granted on %q", r.Upstream)
}

// The same through a Queue: a permit held on upstream u1, Redis loses
// its data, the request fails on u1 and is released with a cooldown (as
// the Caddy handler does when it does not requeue): the next request
// runs on u2, and u1, cooling, takes no request while the cooldown lasts.
func TestQueueReleaseAfterDataLossDoesNotGrantTheCoolingUpstream(t *testing.T) {
	srv := redistest.Start(t)
	cfg := fairqueue.Config{Permits: 2, Lease: 30 * time.Second, PollInterval: 50 * time.Millisecond,
		MaxWait:   10 * time.Second,
		Upstreams: []fairqueue.Upstream{{Dial: "u1:1", Permits: 1}, {Dial: "u2:1", Permits: 1}}}
	nd := newNode(t, srv, "releaseflushcoolq", cfg)
	ctx := context.Background()
	p, err := nd.q.Acquire(ctx, fairqueue.Request{})
	require.NoError(t, err)
	failed := p.Upstream()
	require.Equal(t, "u1:1", failed, "both free: the first of the pool")
	require.NoError(t, srv.Client(t).FlushAll(ctx).Err())

	p.Cool(30 * time.Second)
	p.Release()
	q := tryAcquire(t, nd, fairqueue.Request{}, 10*time.Second)
	require.NotNil(t, q, "u2 is free")
	defer q.Release()
	assert.NotEqual(t, failed, q.Upstream(), "granted on the upstream that failed, which cools, while the other was free")

	// The other upstream busy, the first cooling: a newcomer gets nothing.
	if o := tryAcquire(t, nd, fairqueue.Request{}, time.Second); o != nil {
		o.Release()
		t.Fatalf("granted on %q while %q cools and the next request runs on %q", o.Upstream(), failed, q.Upstream())
	}
}
