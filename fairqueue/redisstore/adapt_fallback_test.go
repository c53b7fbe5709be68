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

// The queue's share learned before a reload gave the queue a pool does
// not apply to the pool (docs/adaptive.md: "the queue's share does not
// apply"): the shared queue grants all 4 of the pool's permits, and
// "when the store is down, on_store_error local queues in each instance
// with its share of the last learned capacity", so the lone node's
// fallback queue runs 4 as well, not the old share of them.
func TestLocalFallbackOfAPoolIsNotCappedByTheQueuesOldShare(t *testing.T) {
	t.Parallel() // its own redis-server: it waits on it, not on the CPU
	srv := redistest.Start(t)
	cfg := fairqueue.Config{Permits: 4, Fallback: memstore.New(), Lease: 1500 * time.Millisecond,
		PollInterval: 50 * time.Millisecond, MaxWait: 10 * time.Second,
		Adaptive: &fairqueue.Adaptive{TargetTTFT: 100 * time.Millisecond, Interval: 100 * time.Millisecond, Decrease: 0.5, MinSamples: 1}}
	n := newNode(t, srv, "fallbackpoolshare", cfg)
	p, err := n.q.Acquire(context.Background(), fairqueue.Request{}) // joins the queue
	require.NoError(t, err)
	p.Release()
	n.q.ObserveTTFT("", time.Second)
	eventually(t, 5*time.Second, func() bool { return n.q.Share() < 1 }, "the share did not move")
	require.Equal(t, map[string]float64{"": 0.5}, n.q.Shares())

	cfg.Name, cfg.Permits = "fallbackpoolshare", 0 // the pool's sum
	cfg.Upstreams = []fairqueue.Upstream{{Dial: "a:1", Permits: 2}, {Dial: "b:1", Permits: 2}}
	require.NoError(t, n.q.Reconfigure(cfg))
	acquireAll := func(local bool) int {
		var held []*fairqueue.Permit
		for range 4 {
			ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
			p, err := n.q.Acquire(ctx, fairqueue.Request{})
			cancel()
			if err != nil {
				break
			}
			assert.Equal(t, local, p.Local())
			held = append(held, p)
		}
		for _, p := range held {
			p.Release()
		}
		return len(held)
	}
	require.Equal(t, 4, acquireAll(false), "the shared queue grants the whole pool")

	srv.Kill()
	eventually(t, 5*time.Second, func() bool { return !n.q.Stats().StoreUp }, "the store is not seen down")
	assert.Equal(t, 4, acquireAll(true), "the fallback queue ran under the queue's old share, which applies to no pool")
}
