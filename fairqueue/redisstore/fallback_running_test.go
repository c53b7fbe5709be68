package redisstore_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
	"github.com/fair-queue/caddy-fair-queue/fairqueue/memstore"
	"github.com/fair-queue/caddy-fair-queue/internal/redistest"
)

// tryAcquire is an Acquire of nd that waits at most d: nil when it got
// nothing by then.
func tryAcquire(t *testing.T, nd *node, req fairqueue.Request, d time.Duration) *fairqueue.Permit {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	p, err := nd.q.Acquire(ctx, req)
	if err != nil {
		return nil
	}
	return p
}

// runningAtTheOutage opens one instance of a queue with on_store_error
// local, takes the permits reqs ask for from Redis, and kills Redis:
// they run on through the outage. A short poll interval, lease and max
// wait unless cfg sets its poll interval.
func runningAtTheOutage(t *testing.T, name string, cfg fairqueue.Config, reqs ...fairqueue.Request) (*node, []*fairqueue.Permit) {
	t.Helper()
	srv := redistest.Start(t)
	cfg.Fallback = memstore.New()
	if cfg.PollInterval == 0 {
		cfg.Lease, cfg.PollInterval, cfg.MaxWait = 30*time.Second, 50*time.Millisecond, 10*time.Second
	}
	nd := newNode(t, srv, name, cfg)
	var running []*fairqueue.Permit
	for _, r := range reqs {
		p, err := nd.q.Acquire(context.Background(), r)
		require.NoError(t, err)
		require.False(t, p.Local(), "granted by Redis")
		running = append(running, p)
	}
	srv.Kill()
	// The first request after the kill finds Redis down (about a second).
	eventually(t, 10*time.Second, func() bool {
		p := tryAcquire(t, nd, fairqueue.Request{Tokens: 1}, 100*time.Millisecond)
		if p != nil {
			p.Release()
		}
		return !nd.q.Stats().StoreUp
	}, "Redis never marked down")
	return nd, running
}

// The requests Redis granted that still run when it goes away count in
// the instance's fallback queue until they end: one instance of
// `permits 2` with two streams running admits nobody more, then one per
// stream that ends.
func TestLocalFallbackCountsTheRequestsRunningAtTheOutage(t *testing.T) {
	t.Parallel() // its own redis-server: it waits on it, not on the CPU
	nd, running := runningAtTheOutage(t, "fbrunning", fairqueue.Config{Permits: 2},
		fairqueue.Request{}, fairqueue.Request{})
	if p := tryAcquire(t, nd, fairqueue.Request{}, time.Second); p != nil {
		p.Release()
		t.Fatalf("the fallback queue admitted a third request beside the 2 Redis granted, still running, for permits 2")
	}
	running[0].Release()
	p := tryAcquire(t, nd, fairqueue.Request{}, 5*time.Second)
	require.NotNil(t, p, "a permit of the 2 freed by the first request's end, not given")
	assert.True(t, p.Local())
	if q := tryAcquire(t, nd, fairqueue.Request{}, time.Second); q != nil {
		q.Release()
		t.Errorf("a third request ran beside the local one and the Redis one still running")
	}
	p.Release()
	running[1].Release()
	var got []*fairqueue.Permit
	for range 2 {
		p := tryAcquire(t, nd, fairqueue.Request{}, 5*time.Second)
		require.NotNil(t, p, "both permits free again, once the Redis requests ended")
		got = append(got, p)
	}
	for _, p := range got {
		p.Release()
	}
}

// With a pool, a request running at the outage counts on its upstream:
// the fallback queue sends the next request to the other one, and
// nothing more while both are taken.
func TestLocalFallbackCountsARunningRequestOnItsUpstream(t *testing.T) {
	nd, running := runningAtTheOutage(t, "fbrunningpool", fairqueue.Config{
		Upstreams: []fairqueue.Upstream{{Dial: "u1:1", Permits: 1}, {Dial: "u2:1", Permits: 1}}}, fairqueue.Request{})
	p := tryAcquire(t, nd, fairqueue.Request{}, 5*time.Second)
	require.NotNil(t, p, "the other upstream is free")
	assert.NotEqual(t, running[0].Upstream(), p.Upstream(), "sent beside the request running on its upstream of 1 permit")
	if q := tryAcquire(t, nd, fairqueue.Request{}, time.Second); q != nil {
		q.Release()
		t.Errorf("a third request ran on %s, with both upstreams of 1 permit taken", q.Upstream())
	}
	running[0].Release()
	q := tryAcquire(t, nd, fairqueue.Request{}, 5*time.Second)
	require.NotNil(t, q, "the upstream freed by the running request's end, not given")
	assert.Equal(t, running[0].Upstream(), q.Upstream())
	q.Release()
	p.Release()
}

// With kv_tokens, a request running at the outage counts its tokens.
func TestLocalFallbackCountsTheTokensRunningAtTheOutage(t *testing.T) {
	nd, running := runningAtTheOutage(t, "fbrunningtokens", fairqueue.Config{Permits: 4, KVTokens: 100},
		fairqueue.Request{Tokens: 80})
	if p := tryAcquire(t, nd, fairqueue.Request{Tokens: 30}, time.Second); p != nil {
		p.Release()
		t.Fatalf("a 30-token request ran beside 80 tokens still running, under kv_tokens 100")
	}
	p := tryAcquire(t, nd, fairqueue.Request{Tokens: 20}, 5*time.Second)
	require.NotNil(t, p, "20 tokens fit beside the 80 running")
	p.Release()
	running[0].Release()
	p = tryAcquire(t, nd, fairqueue.Request{Tokens: 100}, 5*time.Second)
	require.NotNil(t, p, "every token free again, once the running request ended")
	p.Release()
}

// A waiter of the fallback queue gets the permit of a request running at
// the outage as soon as that request ends, as it gets that of a local
// one: not at the fallback queue's next poll, which comes up to
// poll_interval later (here 30 s, the waiter's max wait).
func TestLocalFallbackHandsOnThePermitOfARunningRequestAtItsEnd(t *testing.T) {
	nd, running := runningAtTheOutage(t, "fbrunninghandon", fairqueue.Config{Permits: 1,
		Lease: 90 * time.Second, PollInterval: 30 * time.Second, MaxWait: 30 * time.Second}, fairqueue.Request{})
	got := make(chan *fairqueue.Permit, 1)
	queued := make(chan struct{}, 1)
	go func() {
		p, _ := nd.q.Acquire(context.Background(), fairqueue.Request{
			OnQueued: func(fairqueue.Waiting) { queued <- struct{}{} }})
		got <- p // nil: refused (the queue closes once the test has failed)
	}()
	select {
	case <-queued:
	case p := <-got:
		if p != nil {
			p.Release()
		}
		t.Fatal("a request ran beside the one Redis granted, still running, for permits 1")
	}
	running[0].Release()
	select {
	case p := <-got:
		require.NotNil(t, p, "the waiter was refused")
		assert.True(t, p.Local())
		p.Release()
	case <-time.After(5 * time.Second):
		t.Fatal("the permit the running request freed idled: its waiter was not granted within 5 s of its end (poll_interval 30s)")
	}
}
