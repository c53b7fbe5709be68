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

// failOpenPool opens queue name, a pool of two upstreams under
// on_store_error fail_open, on a Redis that is then stopped: every
// request is admitted fail_open.
func failOpenPool(t *testing.T, name string) *node {
	t.Helper()
	srv := redistest.Start(t)
	n := newNode(t, srv, name, fairqueue.Config{Permits: 2, FailOpen: true, MaxWait: 20 * time.Second,
		PollInterval: 50 * time.Millisecond, Lease: 3 * time.Second,
		Upstreams: []fairqueue.Upstream{{Dial: "a:1", Permits: 1}, {Dial: "b:1", Permits: 1}}})
	ctx := context.Background()
	p, err := n.q.Acquire(ctx, fairqueue.Request{})
	require.NoError(t, err)
	p.Release()
	srv.Stop()
	return n
}

// failOpenOn admits a request fail_open on n's queue.
func failOpenOn(t *testing.T, n *node) *fairqueue.Permit {
	t.Helper()
	p, err := n.q.Acquire(context.Background(), fairqueue.Request{})
	require.NoError(t, err)
	require.True(t, p.FailOpen(), "admitted fail_open: Redis is stopped")
	return p
}

// assertLeftOut admits four requests fail_open on n's queue, one after
// the other, and asserts none goes to the cooling upstream.
func assertLeftOut(t *testing.T, n *node, cooling, why string) {
	t.Helper()
	var ups []string
	for range 4 {
		p := failOpenOn(t, n)
		ups = append(ups, p.Upstream())
		p.Release()
	}
	assert.NotContains(t, ups, cooling, "the upstream that %s cools under fail_open too: requests went to %v", why, ups)
}

// Under on_store_error fail_open (Redis down), the requests admitted go
// to the upstreams in turn: one that just refused a request (requeue_on
// 429 / 503, or a refused connection) cooled nowhere, and was given the
// requeued request's next neighbours at once, every other one of them.
func TestAFailOpenRequeueLeavesTheRefusingUpstreamOut(t *testing.T) {
	t.Parallel() // its own redis-server: it waits on it, not on the CPU
	n := failOpenPool(t, "failopencoolrequeue")
	p := failOpenOn(t, n)
	refused := p.Upstream()
	again, err := p.Requeue(context.Background(), time.Minute)
	require.NoError(t, err)
	assert.NotEqual(t, refused, again.Upstream(), "the requeued request goes to the other upstream")
	again.Release()
	assertLeftOut(t, n, refused, "refused a request")
}

// So does one that failed a request it may have run (a 502 / 504 past
// the dial): its permit is released with a cooldown (Permit.Cool).
func TestAFailOpenCooldownLeavesTheFailingUpstreamOut(t *testing.T) {
	t.Parallel() // its own redis-server: it waits on it, not on the CPU
	n := failOpenPool(t, "failopencoolrelease")
	p := failOpenOn(t, n)
	failed := p.Upstream()
	p.Cool(time.Minute)
	p.Release()
	assertLeftOut(t, n, failed, "failed a request")
}

// Every upstream cooling, a request admitted fail_open still goes to one
// (fail_open admits): the one whose cooldown ends first.
func TestAFailOpenRequestWithEveryUpstreamCoolingGoesToTheFirstBack(t *testing.T) {
	t.Parallel() // its own redis-server: it waits on it, not on the CPU
	n := failOpenPool(t, "failopencoolall")
	long := failOpenOn(t, n)
	short := failOpenOn(t, n)
	require.NotEqual(t, long.Upstream(), short.Upstream())
	long.Cool(time.Minute)
	long.Release()
	short.Cool(30 * time.Second)
	short.Release()
	for range 3 {
		p := failOpenOn(t, n)
		assert.Equal(t, short.Upstream(), p.Upstream(), "the upstream back first")
		p.Release()
	}
}
