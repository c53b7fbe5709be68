package redisstore_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
	"github.com/fair-queue/caddy-fair-queue/fairqueue/redisstore"
	"github.com/fair-queue/caddy-fair-queue/internal/redistest"
)

// A permit Redis counts that runs nowhere (a ghost: a heartbeat that
// reached Redis late adopted a fail-open permit that had ended, or
// re-added one released meanwhile, until the node releases it again)
// is in the view the instance's fallback share is dealt from. An outage
// that begins then must not let the instances' fallback queues run more
// than the permits at once: 4 permits, instances A and B each running 2,
// Redis counting a ghost of A's besides (5 held). A 5th request must
// not start during the outage.
func TestGhostPermitInTheLastViewLetsNoFallbackRunAboveThePermits(t *testing.T) {
	t.Parallel() // its own redis-server: it waits on it, not on the CPU
	const name = "fbghost"
	srv := redistest.Start(t)
	nodes := joinOutageNodes(t, srv, name, 2, fairqueue.Config{Permits: 4})
	a, b := nodes[0], nodes[1]
	var running []*fairqueue.Permit
	for _, nd := range []*node{a, a, b, b} {
		p, err := nd.q.Acquire(context.Background(), fairqueue.Request{})
		require.NoError(t, err)
		require.False(t, p.Local())
		running = append(running, p)
	}
	defer func() {
		for _, p := range running {
			p.Release()
		}
	}()

	// The late heartbeat of A: it adopts a permit of A that has ended
	// (a lease long enough for both instances to see it on a slow machine).
	s := redisstore.New(srv.Client(t), name, redisstore.Options{})
	ghost := fairqueue.TicketID{Node: a.q.Node(), Counter: 1 << 40}.String()
	_, err := s.Heartbeat(context.Background(), fairqueue.HeartbeatArgs{Node: a.q.Node(), Beat: 1 << 40,
		Limits: fairqueue.Limits{Permits: 4, Lease: 30 * time.Second}, Adopt: []string{ghost}})
	require.NoError(t, err)
	for i, nd := range nodes {
		eventually(t, 10*time.Second, func() bool { return nd.q.Stats().Cluster.Holders == 5 },
			"instance %d never saw the 5 permits Redis counts in a heartbeat", i)
	}
	srv.Kill()

	admitted := 0
	for _, nd := range nodes {
		got := admitAll(t, nd)
		admitted += len(got)
		for _, p := range got {
			defer p.Release()
		}
	}
	assert.Zero(t, admitted, "the fallback queues started %d requests beside the 4 running, for 4 permits", admitted)
}
