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

// When the queue's slot moves to another master, the old one
// unsubscribes every node from its grant channel (sunsubscribe); the
// nodes subscribe again on the new owner, so a handoff to another node's
// waiter still arrives over Pub/Sub, long before that node's next
// reconcile would have found it.
func TestHandoffAfterSlotMigrationArrivesBeforeReconcile(t *testing.T) {
	cluster := redistest.StartCluster(t, 3)
	const name = "resub"
	// A reconcile or heartbeat could find the grant only poll (lease/3)
	// after the nodes opened; the handoff must arrive well before.
	const poll = 20 * time.Second
	cfg := fairqueue.Config{Permits: 1, MaxWait: time.Minute, PollInterval: poll, Lease: 3 * poll}
	n1 := openQueue(t, cluster.ClusterClient(t, clusterOpts), name, cfg)
	n2 := openQueue(t, cluster.ClusterClient(t, clusterOpts), name, cfg)
	admin := cluster.ClusterClient(t, clusterOpts)
	tag := redisstore.New(nil, name, redisstore.Options{}).Tag()
	ctx := context.Background()

	// Each node's first acquire opens it: it subscribes to its channel
	// and starts its loop (and its poll ticker).
	opened := time.Now()
	for _, q := range []*fairqueue.Queue{n1, n2} {
		p, err := q.Acquire(ctx, fairqueue.Request{})
		require.NoError(t, err)
		p.Release()
	}
	eventually(t, 10*time.Second, func() bool {
		_, holders := universalState(t, admin, name)
		return len(holders) == 0
	}, "the permit was not released")

	to := cluster.MoveSlot(t, tag).To
	channel := tag + ":node:" + n2.Node()
	newOwner := to.Client(t)
	assert.Eventually(t, func() bool {
		chs, err := newOwner.PubSubShardChannels(ctx, channel).Result()
		return err == nil && len(chs) == 1
	}, 5*time.Second, 20*time.Millisecond, "%s not subscribed to on the slot's new owner", n2.Node())

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
