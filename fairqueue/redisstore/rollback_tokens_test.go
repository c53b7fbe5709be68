package redisstore_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
	"github.com/fair-queue/caddy-fair-queue/fairqueue/redisstore"
	"github.com/fair-queue/caddy-fair-queue/internal/redistest"
)

// rollbackTokensCfg is rollbackCfg bounded by 100 KV-cache tokens, with
// permits to spare: two requests of 60 tokens never run at once.
var rollbackTokensCfg = fairqueue.Config{Permits: 10, KVTokens: 100, MaxWait: 10 * time.Second,
	PollInterval: 100 * time.Millisecond, Lease: 30 * time.Second}

// tsum reads the tokens Redis counts held in queue name.
func tsum(t *testing.T, n *node, name string) int {
	t.Helper()
	tag := redisstore.New(n.rdb, name, redisstore.Options{}).Tag()
	v, err := n.rdb.Get(context.Background(), tag+":tsum").Result()
	if err != nil {
		return 0
	}
	w, err := strconv.Atoi(v)
	require.NoError(t, err)
	return w
}

// acquireReq is acquireAsync for req.
func acquireReq(n *node, ctx context.Context, req fairqueue.Request) <-chan acquired {
	ch := make(chan acquired, 1)
	go func() {
		p, err := n.q.Acquire(ctx, req)
		ch <- acquired{p, err, time.Now()}
	}()
	return ch
}

// stillWaiting asserts the acquire on ch has not returned: its request
// does not run beside those Redis counts.
func stillWaiting(t *testing.T, ch <-chan acquired, why string) {
	t.Helper()
	select {
	case r := <-ch:
		t.Fatalf("%s (err %v)", why, r.err)
	case <-time.After(200 * time.Millisecond):
	}
}

// warmPair starts two nodes of queue name, each joined (one request
// served) and past its first heartbeat.
func warmPair(t *testing.T, srv *redistest.Server, name string, cfg fairqueue.Config) (a, b *node) {
	t.Helper()
	a, b = newNode(t, srv, name, cfg), newNode(t, srv, name, cfg)
	for _, n := range []*node{a, b} {
		p, err := n.q.Acquire(context.Background(), fairqueue.Request{Tokens: 1})
		require.NoError(t, err)
		p.Release()
		beaten(t, n)
	}
	return a, b
}

// A grant of 60 tokens a failover lost is counted again with its weight
// at the resubscribe: a request of 60 tokens of another node waits for
// it (60 + 60 > 100) instead of running beside it, and is served once it
// ends; Redis counts no tokens once everyone leaves.
func TestLostTokenGrantIsCountedAgainWithItsWeight(t *testing.T) {
	srv := redistest.Start(t)
	const name = "lost-token-grant"
	cfg := rollbackTokensCfg
	a, b := warmPair(t, srv, name, cfg)
	admin := srv.Client(t)
	ctx, cancel := context.WithTimeout(context.Background(), cfg.MaxWait)
	defer cancel()

	rollback := snapshot(t, admin)
	held, err := a.q.Acquire(ctx, fairqueue.Request{Tokens: 60}) // the grant: lost
	require.NoError(t, err)
	rollback(func() { require.Zero(t, tsum(t, a, name), "the rollback lost a's grant") })
	eventually(t, 5*time.Second, func() bool { return tsum(t, a, name) == 60 }, "a's request is not counted again with its 60 tokens")
	beside := acquireReq(b, ctx, fairqueue.Request{Tokens: 60})
	stillWaiting(t, beside, "b's request of 60 tokens started beside a's: 120 tokens held of 100")
	held.Release()
	r := waitFor(t, beside, "b's request")
	require.NoError(t, r.err)
	assert.Equal(t, 60, tsum(t, a, name), "b's request alone")
	r.p.Release()
	eventually(t, 5*time.Second, func() bool { return tsum(t, a, name) == 0 }, "tokens left counted for ended requests")
	require.NoError(t, a.q.Close())
	require.NoError(t, b.q.Close())
	assert.Empty(t, srv.Keys(t, "*"), "keys left after every node left")
}

// A release of 60 tokens a failover lost is released again after the
// resubscribe: a request of 60 tokens of another node is served within
// its max wait (a lease shorter than the lease), and the tokens Redis
// counts are its own alone.
func TestLostTokenReleaseIsReleasedAgain(t *testing.T) {
	srv := redistest.Start(t)
	const name = "lost-token-release"
	cfg := rollbackTokensCfg
	a, b := warmPair(t, srv, name, cfg)
	admin := srv.Client(t)
	ctx, cancel := context.WithTimeout(context.Background(), cfg.MaxWait)
	defer cancel()

	held, err := a.q.Acquire(ctx, fairqueue.Request{Tokens: 60})
	require.NoError(t, err)
	rollback := snapshot(t, admin)
	held.Release() // the release: lost
	eventually(t, 5*time.Second, func() bool { return tsum(t, a, name) == 0 }, "the release never reached Redis")
	rollback(func() { require.Equal(t, 60, tsum(t, a, name), "the rollback brought the 60 tokens back") })
	r := waitFor(t, acquireReq(b, ctx, fairqueue.Request{Tokens: 60}), "b's request")
	require.NoError(t, r.err, "b's request, with the 60 tokens released again")
	assert.Equal(t, 60, tsum(t, a, name), "b's request alone")
	r.p.Release()
	eventually(t, 5*time.Second, func() bool { return tsum(t, a, name) == 0 }, "tokens left counted for ended requests")
	require.NoError(t, a.q.Close())
	require.NoError(t, b.q.Close())
	assert.Empty(t, srv.Keys(t, "*"), "keys left after every node left")
}

// A waiter of 60 tokens a failover lost (its acquire) is queued again
// with its weight: granted once the holder ends, it keeps a later request
// of 60 tokens out until it ends.
func TestLostTokenAcquireIsQueuedAgainWithItsWeight(t *testing.T) {
	srv := redistest.Start(t)
	const name = "lost-token-acquire"
	cfg := rollbackTokensCfg
	a, b := warmPair(t, srv, name, cfg)
	admin := srv.Client(t)
	ctx, cancel := context.WithTimeout(context.Background(), cfg.MaxWait)
	defer cancel()

	held, err := a.q.Acquire(ctx, fairqueue.Request{Tokens: 60})
	require.NoError(t, err)
	rollback := snapshot(t, admin)
	lost := acquireReq(b, ctx, fairqueue.Request{Tokens: 60}) // b's waiter: lost
	eventually(t, 5*time.Second, func() bool { return len(readState(t, admin, name).Waiting) == 1 }, "b's waiter never queued")
	rollback(func() { require.Empty(t, readState(t, admin, name).Waiting, "the rollback lost b's waiter") })
	eventually(t, 5*time.Second, func() bool { return len(readState(t, admin, name).Waiting) == 1 }, "b's waiter was not queued again")
	held.Release()
	first := waitFor(t, lost, "b's waiter")
	require.NoError(t, first.err, "b's waiter, queued again")
	assert.Equal(t, 60, tsum(t, a, name), "b's request counts its 60 tokens")
	later := acquireReq(a, ctx, fairqueue.Request{Tokens: 60})
	stillWaiting(t, later, "a's request of 60 tokens started beside b's: 120 tokens held of 100")
	first.p.Release()
	second := waitFor(t, later, "a's request")
	require.NoError(t, second.err)
	second.p.Release()
	eventually(t, 5*time.Second, func() bool { return tsum(t, a, name) == 0 }, "tokens left counted for ended requests")
	require.NoError(t, a.q.Close())
	require.NoError(t, b.q.Close())
	assert.Empty(t, srv.Keys(t, "*"), "keys left after every node left")
}
