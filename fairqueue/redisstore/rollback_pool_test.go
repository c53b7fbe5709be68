package redisstore_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
)

// rollbackPoolCfg is rollbackCfg with a pool of two upstreams of one
// permit each.
var rollbackPoolCfg = fairqueue.Config{Permits: 2, MaxWait: 10 * time.Second, PollInterval: 100 * time.Millisecond,
	Lease: 30 * time.Second, Upstreams: []fairqueue.Upstream{{Dial: "a:1", Permits: 1}, {Dial: "b:1", Permits: 1}}}

// notOn acquires with max wait d on n and asserts the request is not
// granted on upstream dial: it waits (and times out) or runs elsewhere.
func notOn(t *testing.T, n *node, dial string, d time.Duration, why string) {
	t.Helper()
	p, err := n.q.Acquire(context.Background(), fairqueue.Request{MaxWait: d})
	if err != nil {
		var rej *fairqueue.RejectError
		require.True(t, errors.As(err, &rej), "a reject: %v", err)
		return
	}
	defer p.Release()
	assert.NotEqual(t, dial, p.Upstream(), why)
}

// A requeue a failover lost (an upstream answered 429: the request waits
// again, the upstream cools) is redone by the reconcile that releases the
// old ticket again: the upstream that refused cools, as Permit.Requeue
// promises, and gets no request until its cooldown ends (the next
// request waits: the other upstream runs the requeued one); Redis counts the
// requeued request on the upstream it runs on and is left clean.
func TestLostRequeueStillCoolsTheUpstream(t *testing.T) {
	s := oneNodeScene(t, "lost-requeue-cool", rollbackPoolCfg)
	n := s.a

	old, err := n.q.Acquire(s.ctx, fairqueue.Request{})
	require.NoError(t, err)
	refused := old.Upstream()
	require.NotEmpty(t, refused)
	beaten(t, n)
	rollback := snapshot(t, s.admin)
	held, err := old.Requeue(s.ctx, time.Minute) // the requeue, and its cooldown: lost
	require.NoError(t, err)
	require.NotEqual(t, refused, held.Upstream(), "the requeued request runs on the other upstream")
	rollback(func() {
		require.Equal(t, map[string]string{old.Ticket(): refused}, uheld(t, n, s.name), "the rollback brought the old grant back")
	})
	eventually(t, 5*time.Second, s.holdsOnly(t, held.Ticket()), "Redis does not count the requeued request in place of the old ticket")
	assert.Equal(t, map[string]string{held.Ticket(): held.Upstream()}, uheld(t, n, s.name), "the requeued request, on its upstream")

	notOn(t, n, refused, 2*time.Second, "granted on the upstream that answered 429 a moment ago: its cooldown was lost with the requeue")
	held.Release()
	s.leave(t)
}

// A release a failover lost, of a request whose upstream failed it
// (Permit.Cool: a 503, a refused connection), is released again by the
// reconcile after the resubscribe, and the upstream cools, as Permit.Cool
// promises: with the other upstream busy, the next request waits.
func TestLostCoolingReleaseStillCoolsTheUpstream(t *testing.T) {
	s := oneNodeScene(t, "lost-release-cool", rollbackPoolCfg)
	n := s.a
	ctx := context.Background()
	p, err := n.q.Acquire(ctx, fairqueue.Request{})
	require.NoError(t, err)
	other, err := n.q.Acquire(ctx, fairqueue.Request{}) // the other upstream is busy
	require.NoError(t, err)
	failed := p.Upstream()
	beaten(t, n)
	rollback := snapshot(t, s.admin)
	p.Cool(time.Minute)
	p.Release() // the release, and its cooldown: lost
	s.holding(t, 1, "the release never reached Redis")
	rollback(func() { require.Len(t, s.state(t).Holders, 2, "the rollback brought the permit back") })
	s.holding(t, 1, "the lost release was not released again")
	assert.Equal(t, map[string]string{other.Ticket(): other.Upstream()}, uheld(t, n, s.name), "the request still running, on its upstream")

	notOn(t, n, failed, 2*time.Second, "granted on the upstream that failed a moment ago: its cooldown was lost with the release")
	other.Release()
	s.leave(t)
}

// A grant a failover lost, on upstream X of a pool of two of one permit
// each, is counted again on X at the resubscribe: of two requests of
// another node, one runs on the other upstream and the other waits for
// X's request to end, instead of running on X beside it.
func TestLostPoolGrantCountsOnItsUpstreamAgain(t *testing.T) {
	s := warmScene(t, "lost-pool-grant", rollbackPoolCfg)
	a, b := s.a, s.b

	rollback := snapshot(t, s.admin)
	held, err := a.q.Acquire(s.ctx, fairqueue.Request{}) // the grant: lost
	require.NoError(t, err)
	x := held.Upstream()
	rollback(func() { require.Empty(t, uheld(t, a, s.name), "the rollback lost a's grant") })
	eventually(t, 5*time.Second, func() bool { return uheld(t, a, s.name)[held.Ticket()] == x },
		"a's request is not counted again on its upstream %s", x)
	other, err := b.q.Acquire(s.ctx, fairqueue.Request{})
	require.NoError(t, err)
	assert.NotEqual(t, x, other.Upstream(), "b's first request runs beside a's on %s: 2 running with 1 permit", x)
	beside := acquireAsync(b, s.ctx)
	stillWaiting(t, beside, "b's second request started: 3 running on 2 upstreams of 1 permit")
	held.Release()
	r := waitFor(t, beside, "b's second request")
	require.NoError(t, r.err)
	assert.Equal(t, x, r.p.Upstream(), "b's second request, on the upstream a's freed")
	r.p.Release()
	other.Release()
	s.leave(t)
}
