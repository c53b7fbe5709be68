package redisstore_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
)

// rollbackCfg has one permit and a lease (the default) far longer than
// the waiters' max_wait: a permit held in Redis for nobody until its
// lease ends keeps a waiter out until it times out.
var rollbackCfg = fairqueue.Config{Permits: 1, MaxWait: 10 * time.Second, PollInterval: 100 * time.Millisecond, Lease: 30 * time.Second}

// lostReleaseCfg has a lease three times the waiters' max_wait, and short
// enough that the reconciles a node runs for a third of it after it
// joined (its first subscription) end before the test loses a release:
// only the resubscribe after the rollback can make the node reconcile.
var lostReleaseCfg = fairqueue.Config{Permits: 1, MaxWait: 4 * time.Second, PollInterval: 100 * time.Millisecond, Lease: 12 * time.Second}

// A release that a failover lost (the data set rolled back to before it,
// the epoch kept) leaves the permit held in Redis for a request that has
// ended, by a node with nothing waiting (renewed less than a third of a
// lease before: the waiter's max_wait ends before its lease). Once the node subscribes again
// (the failover dropped its Pub/Sub connection) it reconciles, finds the
// permit among its holders and releases it again: a waiter of another
// node is served, long before the lease would have ended, and Redis is
// left clean.
func TestLostReleaseIsReleasedAgainAfterTheResubscribe(t *testing.T) {
	s := newScene(t, "lost-release", lostReleaseCfg)
	a, b, cfg := s.a, s.b, s.cfg
	ctx := context.Background()
	for _, n := range []*node{a, b} {
		warm, err := n.q.Acquire(ctx, fairqueue.Request{}) // joined and subscribed
		require.NoError(t, err)
		warm.Release()
	}
	time.Sleep(cfg.Lease/3 + 500*time.Millisecond) // the reconciles after the joins are over

	held, err := a.q.Acquire(ctx, fairqueue.Request{})
	require.NoError(t, err)
	rollback := snapshot(t, s.admin)
	held.Release() // the write the failover loses
	s.holding(t, 0, "the release never reached Redis")
	rollback(func() {
		require.Len(t, s.state(t).Holders, 1, "the rollback brought the released permit back")
	})

	wctx, cancel := context.WithTimeout(ctx, cfg.MaxWait)
	defer cancel()
	waiter := acquireAsync(b, wctx)
	select {
	case r := <-waiter:
		require.NoError(t, r.err, "the waiter on the other node, with the permit released (lease %v)", cfg.Lease)
		r.p.Release()
	case <-time.After(cfg.MaxWait + 5*time.Second):
		t.Fatal("the waiter's acquire never returned")
	}
	s.leave(t)
}
