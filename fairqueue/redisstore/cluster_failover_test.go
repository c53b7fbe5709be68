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

// After the master of the queue's slot hands it to its replica (CLUSTER
// FAILOVER, as in a rolling upgrade) and then replicates another master,
// a handoff to another node's waiter still arrives over Pub/Sub, long
// before that node's next reconcile: the nodes subscribe again on the
// new master once their client learns of it (here: from the MOVED of
// their next call), although Redis 7.0 never unsubscribed them from the
// old one.
func TestHandoffAfterClusterFailoverArrivesBeforeReconcile(t *testing.T) {
	cluster := redistest.StartCluster(t, 3)
	const name = "failover"
	// A reconcile or heartbeat could find the grant only poll (lease/3)
	// after the nodes opened; the handoff must arrive well before.
	const poll = 30 * time.Second
	cfg := fairqueue.Config{Permits: 1, MaxWait: time.Minute, PollInterval: poll, Lease: 3 * poll}
	tag := redisstore.New(nil, name, redisstore.Options{}).Tag()
	old := cluster.SlotOwner(t, tag)
	replica := cluster.AddReplica(t, tag)
	n1 := openQueue(t, cluster.ClusterClient(t, clusterOpts), name, cfg)
	n2 := openQueue(t, cluster.ClusterClient(t, clusterOpts), name, cfg)
	admin := cluster.ClusterClient(t, clusterOpts)
	ctx := context.Background()

	// Each node's first acquire opens it: it subscribes to its channel
	// and starts its loop (and its poll ticker).
	opened := time.Now()
	acquireRelease := func() {
		for _, q := range []*fairqueue.Queue{n1, n2} {
			p, err := q.Acquire(ctx, fairqueue.Request{})
			require.NoError(t, err)
			p.Release()
		}
	}
	acquireRelease()
	cluster.Failover(t, replica, tag)
	other := cluster.Nodes()[0]
	if other == old {
		other = cluster.Nodes()[1]
	}
	cluster.Replicate(t, old, other)
	acquireRelease() // MOVED: each node's client learns the new master

	p1, err := n1.Acquire(ctx, fairqueue.Request{})
	require.NoError(t, err)
	type result struct {
		p   *fairqueue.Permit
		err error
	}
	granted := make(chan result, 1) // the test may end first: Close ends the Acquire
	go func() {
		p, err := n2.Acquire(ctx, fairqueue.Request{})
		granted <- result{p, err}
	}()
	eventually(t, 10*time.Second, func() bool {
		waiting, _ := universalState(t, admin, name)
		return len(waiting) == 1
	}, "the second node's ticket is not queued")
	newMaster := replica.Client(t)
	assert.Eventually(t, func() bool {
		chs, err := newMaster.PubSubShardChannels(ctx, tag+":node:*").Result()
		return err == nil && len(chs) == 2
	}, 5*time.Second, 20*time.Millisecond, "the nodes are not subscribed on the new master")

	released := time.Now()
	require.Less(t, released.Sub(opened), poll/2,
		"the test's setup took too long to tell a handoff from the first reconcile")
	p1.Release()
	select {
	case r := <-granted:
		require.NoError(t, r.err, "acquire on the second node")
		t.Logf("handoff arrived %v after the release", time.Since(released).Round(time.Millisecond))
		r.p.Release()
	case <-time.After(5 * time.Second):
		t.Fatalf("no handoff within 5s of the release (the next reconcile is %v after the nodes opened)", poll)
	}
}
