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

// While Redis is away the node queues in its local fallback queue. A
// reload that removes an upstream of the pool must keep it from new
// grants there too: the waiters already queued locally must not be
// granted on it.
func TestLocalFallbackGivesNoGrantToAnUpstreamARemovedByReload(t *testing.T) {
	t.Parallel() // its own redis-server: it waits on it, not on the CPU
	srv := redistest.Start(t)
	cfg := fairqueue.Config{Upstreams: []fairqueue.Upstream{{Dial: "a:1", Permits: 1}, {Dial: "b:1", Permits: 1}},
		LocalPermits: 2, Fallback: memstore.New(),
		Lease: 1500 * time.Millisecond, PollInterval: 50 * time.Millisecond, MaxWait: 10 * time.Second}
	n := newNode(t, srv, "local-pool", cfg)
	p, err := n.q.Acquire(context.Background(), fairqueue.Request{})
	require.NoError(t, err)
	p.Release()
	srv.Kill()
	held := map[string]*fairqueue.Permit{}
	for range 2 {
		p, err := n.q.Acquire(context.Background(), fairqueue.Request{})
		require.NoError(t, err)
		require.True(t, p.Local())
		held[p.Upstream()] = p
	}
	require.Len(t, held, 2, "one on each upstream")
	waiter := make(chan *fairqueue.Permit, 1)
	go func() {
		p, err := n.q.Acquire(context.Background(), fairqueue.Request{})
		assert.NoError(t, err)
		waiter <- p
	}()
	time.Sleep(200 * time.Millisecond) // queued in the local queue

	// A reload removes a:1.
	cfg.Name = "local-pool"
	cfg.Upstreams = []fairqueue.Upstream{{Dial: "b:1", Permits: 1}}
	require.NoError(t, n.q.Reconfigure(cfg))
	held["a:1"].Release() // a:1's request ends: a:1 is no longer in the pool
	select {
	case p := <-waiter:
		assert.NotEqual(t, "a:1", p.Upstream(), "granted on the upstream the reload removed")
		p.Release()
	case <-time.After(500 * time.Millisecond):
		// waits for b:1, as it should
		held["b:1"].Release()
		p := <-waiter
		assert.Equal(t, "b:1", p.Upstream())
		p.Release()
		return
	}
	held["b:1"].Release()
}
