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

// outageNodes opens n instances of one queue with on_store_error local
// (each its own in-process fallback, as each Caddy has), lets each see
// the n live instances in a heartbeat, then kills Redis.
func outageNodes(t *testing.T, name string, n int, cfg fairqueue.Config) []*node {
	t.Helper()
	srv := redistest.Start(t)
	nodes := joinOutageNodes(t, srv, name, n, cfg)
	for i, nd := range nodes {
		eventually(t, 10*time.Second, func() bool { return nd.q.Stats().Cluster.Nodes == n },
			"instance %d never saw the %d live instances in a heartbeat", i, n)
	}
	srv.Kill()
	return nodes
}

// joinOutageNodes opens n instances of one queue on srv with
// on_store_error local (each its own in-process fallback, as each Caddy
// has), each joined by a request it took and gave back.
func joinOutageNodes(t *testing.T, srv *redistest.Server, name string, n int, cfg fairqueue.Config) []*node {
	t.Helper()
	cfg.Lease, cfg.PollInterval, cfg.MaxWait = 3*time.Second, 50*time.Millisecond, 5*time.Second
	nodes := make([]*node, n)
	for i := range nodes {
		c := cfg
		c.Fallback = memstore.New()
		nodes[i] = newNode(t, srv, name, c)
		p, err := nodes[i].q.Acquire(context.Background(), fairqueue.Request{})
		require.NoError(t, err)
		p.Release()
	}
	return nodes
}

// admitAll takes, on node nd cut off from Redis, every local permit it
// admits at once (an acquire that waits 300ms for one more ends it, once
// the node has found Redis down).
func admitAll(t *testing.T, nd *node) []*fairqueue.Permit {
	t.Helper()
	var got []*fairqueue.Permit
	for {
		wait := 300 * time.Millisecond
		if len(got) == 0 {
			wait = 4 * time.Second // the first finds Redis down
		}
		ctx, cancel := context.WithTimeout(context.Background(), wait)
		p, err := nd.q.Acquire(ctx, fairqueue.Request{})
		cancel()
		if err != nil {
			return got
		}
		require.True(t, p.Local(), "admitted by the local fallback")
		got = append(got, p)
		require.Less(t, len(got), 20, "the fallback admits without bound")
	}
}

// While Redis is down, the instances' fallback queues split a pool's
// upstreams between them: two instances and two upstreams of 1 permit
// each, one request on each upstream, none on one upstream twice.
func TestLocalFallbacksSplitAPoolsUpstreamsAmongTheInstances(t *testing.T) {
	t.Parallel() // its own redis-server: it waits on it, not on the CPU
	nodes := outageNodes(t, "fbsplitpool", 2, fairqueue.Config{
		Upstreams: []fairqueue.Upstream{{Dial: "u2:1", Permits: 1}, {Dial: "u1:1", Permits: 1}}})
	on := map[string][]string{}
	for i, nd := range nodes {
		for _, p := range admitAll(t, nd) {
			on[p.Upstream()] = append(on[p.Upstream()], fmt.Sprint("instance ", i))
			defer p.Release()
		}
	}
	for up, who := range on {
		assert.Len(t, who, 1, "upstream %s of 1 permit ran %v at once during the outage", up, who)
	}
	assert.Len(t, on, 2, "both upstreams serve during the outage: %v", on)
}

// While Redis is down, the instances' fallback queues together admit the
// queue's permits: 5 permits over 3 instances are 2, 2 and 1, not 1
// each.
func TestLocalFallbacksTogetherAdmitThePermits(t *testing.T) {
	t.Parallel() // its own redis-server: it waits on it, not on the CPU
	nodes := outageNodes(t, "fbsplitpermits", 3, fairqueue.Config{Permits: 5})
	var each []int
	total := 0
	for _, nd := range nodes {
		got := admitAll(t, nd)
		each = append(each, len(got))
		total += len(got)
		for _, p := range got {
			defer p.Release()
		}
	}
	assert.Equal(t, 5, total, "the 3 instances' fallback queues admitted %v at once, for 5 permits", each)
}
