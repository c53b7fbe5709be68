package redisstore_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
	"github.com/fair-queue/caddy-fair-queue/fairqueue/memstore"
	"github.com/fair-queue/caddy-fair-queue/internal/redistest"
)

// Local fallback, the outage, fair queueing: the waiters of the shared
// queue that move into the fallback queue are served there in the order
// Redis would have served them, though the fallback queue has a permit
// free as they enter: an under-served tenant's or a higher priority
// band's waiter that came later is not left behind the lower ones
// because those entered first. The node's waiters wait in Redis behind
// the one permit, held by another node; Redis goes away for that node
// alone, whose fallback queue (local_permits 1) runs none of them yet.
// The same waiters served by Redis (the permit released, no outage) give
// the order expected.
func TestLocalFallbackServesTheMovedWaitersInTheOrderOfTheirQueue(t *testing.T) {
	a, b := fairqueue.Request{Tenant: "a"}, fairqueue.Request{Tenant: "b"}
	high := fairqueue.Request{Tenant: "a", Priority: 3}
	for _, tc := range []struct {
		name  string
		reqs  []fairqueue.Request
		names []string
		want  []string // as Redis serves them
	}{
		{"fair", []fairqueue.Request{a, a, a, b}, []string{"a1", "a2", "a3", "b1"}, []string{"a1", "b1", "a2", "a3"}},
		{"priority", []fairqueue.Request{a, a, a, high}, []string{"a1", "a2", "a3", "high"}, []string{"a1", "high", "a2", "a3"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			byRedis := servedOrder(t, "fbmovedorder-redis-"+tc.name, tc.reqs, tc.names, false)
			require.Equal(t, tc.want, byRedis, "Redis's own order")
			byFallback := servedOrder(t, "fbmovedorder-"+tc.name, tc.reqs, tc.names, true)
			assert.Equal(t, byRedis, byFallback, "the moved waiters are served by the fallback queue in the order Redis would have served them")
		})
	}
}

// servedOrder queues reqs (named names) on node a of a fair queue of one
// permit held by node b, and returns the order they are served in: by
// the fallback queue once a is cut off from Redis (outage), or else by
// Redis once b releases its permit. Each request releases its permit at
// once.
func servedOrder(t *testing.T, name string, reqs []fairqueue.Request, names []string, outage bool) []string {
	t.Helper()
	srv := redistest.Start(t)
	cfg := fairqueue.Config{Permits: 1, LocalPermits: 1, Fair: true, Fallback: memstore.New(),
		Lease: 30 * time.Second, PollInterval: 50 * time.Millisecond, MaxWait: 20 * time.Second}
	na, nb, px := cutOffPair(t, srv, name, cfg, fairqueue.Request{}, fairqueue.Request{})
	held, err := nb.q.Acquire(context.Background(), fairqueue.Request{})
	require.NoError(t, err)
	defer held.Release()
	out := make(chan outcome, len(reqs))
	for i, r := range reqs {
		reqInTurn(t, na, i, r, out)
	}
	require.Len(t, readState(t, na.rdb, name).Waiting, len(reqs), "the waiters queued in Redis")
	if outage {
		px.Cut()
		defer px.Heal()
		eventually(t, 10*time.Second, func() bool { return !na.q.Stats().StoreUp }, "Redis never marked down")
	} else {
		held.Release()
	}
	var order []string
	for range reqs {
		select {
		case o := <-out:
			switch {
			case o.err != nil:
				order = append(order, fmt.Sprintf("%s:%v", names[o.i], o.err))
			case o.local != outage:
				order = append(order, fmt.Sprintf("%s:local %v", names[o.i], o.local))
			default:
				order = append(order, names[o.i])
			}
		case <-time.After(30 * time.Second):
			t.Fatalf("only %v answered", order)
		}
	}
	return order
}

// reqInTurn starts request i (req) on n, reporting to out, and returns
// once it has queued (OnQueued).
func reqInTurn(t *testing.T, n *node, i int, req fairqueue.Request, out chan<- outcome) {
	t.Helper()
	queued := make(chan struct{}, 1)
	req.OnQueued = func(fairqueue.Waiting) {
		select {
		case queued <- struct{}{}:
		default:
		}
	}
	go func() {
		p, err := n.q.Acquire(context.Background(), req)
		if err != nil {
			out <- outcome{i: i, err: err}
			return
		}
		out <- outcome{i: i, waited: p.Waited(), local: p.Local()}
		p.Release()
	}()
	select {
	case <-queued:
	case <-time.After(10 * time.Second):
		t.Fatalf("request %d never queued", i)
	}
}
