package redisstore_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
	"github.com/fair-queue/caddy-fair-queue/fairqueue/memstore"
	"github.com/fair-queue/caddy-fair-queue/internal/redistest"
)

// gatedRequeue holds, once armed, the next requeue call on its way to
// Redis until open is closed.
type gatedRequeue struct {
	fairqueue.Store
	armed   atomic.Bool
	entered chan struct{}
	open    chan struct{}
}

func (g *gatedRequeue) Requeue(ctx context.Context, args fairqueue.RequeueArgs) (fairqueue.AcquireResult, error) {
	if g.armed.CompareAndSwap(true, false) {
		close(g.entered)
		<-g.open
	}
	return g.Store.Requeue(ctx, args)
}

// A pool, a requeue (its upstream refused the request) whose call to
// Redis fails, sent under fail_closed, while a reload sets
// on_store_error local: the request waits in the fallback queue of the
// settings in force, its upstream cooling there as a requeue that meets
// a dead Redis under local cools it. Read before the call, the policy
// kept the cooldown from the fallback queue: the request was granted
// again at once on the upstream that had just refused it.
func TestLocalFallbackOfAReloadCoolsTheUpstreamOfARequeueOnItsWay(t *testing.T) {
	t.Parallel() // its own redis-server: it waits on it, not on the CPU
	srv := redistest.Start(t)
	g := &gatedRequeue{entered: make(chan struct{}), open: make(chan struct{})}
	t.Cleanup(func() {
		select {
		case <-g.open:
		default:
			close(g.open)
		}
	})
	cfg := fairqueue.Config{Upstreams: []fairqueue.Upstream{{Dial: "10.0.0.1:8000", Permits: 1}, {Dial: "10.0.0.2:8000", Permits: 1}},
		Lease: 30 * time.Second, PollInterval: 50 * time.Millisecond, MaxWait: 20 * time.Second}
	n := wrappedNode(t, srv, "fbreloadrequeue", cfg, func(s fairqueue.Store) fairqueue.Store { g.Store = s; return g })
	queued := make(chan struct{}, 1)
	first, err := n.q.Acquire(context.Background(), fairqueue.Request{OnQueued: func(fairqueue.Waiting) {
		select {
		case queued <- struct{}{}:
		default:
		}
	}})
	require.NoError(t, err)
	other, err := n.q.Acquire(context.Background(), fairqueue.Request{})
	require.NoError(t, err)
	defer other.Release()
	refused := first.Upstream()
	require.NotEqual(t, refused, other.Upstream(), "Redis granted one request on each upstream")

	type result struct {
		p   *fairqueue.Permit
		err error
	}
	requeued := make(chan result, 1)
	g.armed.Store(true)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
		defer cancel()
		p, err := first.Requeue(ctx, 30*time.Second)
		requeued <- result{p, err}
	}()
	select {
	case <-g.entered:
	case <-time.After(10 * time.Second):
		t.Fatal("the requeue never went to Redis")
	}
	cfg.Fallback, cfg.LocalPermits = memstore.New(), 2
	require.NoError(t, n.q.Reconfigure(cfg))
	srv.Kill()
	close(g.open)

	select {
	case <-queued: // waits in the fallback queue: its upstream cools, the other runs a request
	case r := <-requeued:
		if r.p != nil {
			defer r.p.Release()
		}
		t.Fatalf("the requeued request was answered while its upstream cools and the other runs a request: upstream %q (refused %q), err %v",
			upstreamOf(r.p), refused, r.err)
	case <-time.After(10 * time.Second):
		t.Fatal("the requeued request never queued in the fallback queue")
	}
	other.Release()
	select {
	case r := <-requeued:
		require.NoError(t, r.err)
		assert.True(t, r.p.Local())
		assert.NotEqual(t, refused, r.p.Upstream(), "served on the upstream that refused it, while it cools")
		r.p.Release()
	case <-time.After(10 * time.Second):
		t.Fatal("the requeued request was never served")
	}
}
