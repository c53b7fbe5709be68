package redisstore_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
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

	_, to := moveSlot(t, cluster, tag)
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

// moveSlot moves the slot of key to another master the way redis-cli
// --cluster reshard does (IMPORTING on the new owner, MIGRATING on the
// old, the keys moved with MIGRATE, then NODE on every master, the new
// owner first) and waits until every master agrees. The old owner
// unsubscribes the clients of the slot's shard channels. It returns the
// old and the new owner.
func moveSlot(t *testing.T, c *redistest.Cluster, key string) (from, to *redistest.Server) {
	t.Helper()
	ctx := context.Background()
	nodes := c.Nodes()
	var clients []*redis.Client
	var ids []string
	for _, n := range nodes {
		cl := n.Client(t)
		id, err := cl.ClusterMyID(ctx).Result()
		require.NoError(t, err)
		clients, ids = append(clients, cl), append(ids, id)
	}
	s, err := clients[0].ClusterKeySlot(ctx, key).Result()
	require.NoError(t, err)
	slot := int(s)
	fi := slices.Index(ids, slotOwner(t, clients[0], slot))
	require.NotEqual(t, -1, fi, "no master owns slot %d", slot)
	ti := (fi + 1) % len(nodes)

	require.NoError(t, clients[ti].Do(ctx, "CLUSTER", "SETSLOT", slot, "IMPORTING", ids[fi]).Err())
	require.NoError(t, clients[fi].Do(ctx, "CLUSTER", "SETSLOT", slot, "MIGRATING", ids[ti]).Err())
	for {
		keys, err := clients[fi].ClusterGetKeysInSlot(ctx, slot, 100).Result()
		require.NoError(t, err)
		if len(keys) == 0 {
			break
		}
		args := []any{"MIGRATE", "127.0.0.1", nodes[ti].Port(), "", 0, 5000, "KEYS"}
		for _, k := range keys {
			args = append(args, k)
		}
		require.NoError(t, clients[fi].Do(ctx, args...).Err())
	}
	order := []int{ti, fi}
	for i := range nodes {
		if i != ti && i != fi {
			order = append(order, i)
		}
	}
	for _, i := range order {
		require.NoError(t, clients[i].Do(ctx, "CLUSTER", "SETSLOT", slot, "NODE", ids[ti]).Err())
	}
	eventually(t, 10*time.Second, func() bool {
		for _, cl := range clients {
			if slotOwner(t, cl, slot) != ids[ti] {
				return false
			}
		}
		return true
	}, "masters do not agree that %s owns slot %d", nodes[ti].Addr(), slot)
	return nodes[fi], nodes[ti]
}

// slotOwner returns the ID of the master that rdb says serves slot.
func slotOwner(t *testing.T, rdb *redis.Client, slot int) string {
	t.Helper()
	slots, err := rdb.ClusterSlots(context.Background()).Result()
	require.NoError(t, err)
	for _, s := range slots {
		if s.Start <= slot && slot <= s.End && len(s.Nodes) > 0 {
			return s.Nodes[0].ID
		}
	}
	return ""
}
