package notifier_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/internal/redistest"
	"github.com/fair-queue/caddy-fair-queue/notifier"
)

// When a replica takes over the master of a shard channel's slot
// (CLUSTER FAILOVER), Redis 7.0 sends the old master's shard-channel
// subscribers no sunsubscribe: they stay subscribed there, now on a
// replica, which gets the new master's messages only while it
// replicates it. Once it replicates another master (an operator's
// rearrangement, or Redis' own replica migration) the channel is dead,
// and nothing tells. The Subscription notices that its client routes
// the slot to another master than the one it subscribed on, subscribes
// again there and reports it through Subscribed.
func TestShardChannelFollowsItsSlotThroughAFailover(t *testing.T) {
	cluster := redistest.StartCluster(t, 3)
	const channel = "{fq:test}:node:a"
	old := cluster.SlotOwner(t, channel)
	replica := cluster.AddReplica(t, channel)
	ctx := context.Background()
	rdb := cluster.ClusterClient(t)
	ev := newEvents()
	sub, err := notifier.Subscribe(ctx, rdb, channel, true, ev.listener())
	require.NoError(t, err)
	t.Cleanup(func() { _ = sub.Close() })
	require.NoError(t, rdb.SPublish(ctx, channel, "before").Err())
	assert.Equal(t, "before", ev.message(t, 5*time.Second))

	cluster.Failover(t, replica, channel)
	other := cluster.Nodes()[0]
	if other == old {
		other = cluster.Nodes()[1]
	}
	cluster.Replicate(t, old, other)
	// The client learns the new slot map, as a node's does from the MOVED
	// of its next script (or its periodic reload).
	rdb.ReloadState(ctx)
	learned := time.Now()

	newMaster := replica.Client(t)
	if assert.Eventually(t, func() bool {
		chs, err := newMaster.PubSubShardChannels(ctx, channel).Result()
		return err == nil && len(chs) == 1
	}, 10*time.Second, 20*time.Millisecond, "not subscribed on the new master within 10s") {
		t.Logf("subscribed on the new master %v after the client learnt of it", time.Since(learned).Round(time.Millisecond))
	}
	n, err := rdb.SPublish(ctx, channel, "after").Result()
	require.NoError(t, err)
	assert.Equal(t, int64(1), n, "receivers of SPUBLISH on the new master")
	assert.Equal(t, "after", ev.message(t, 5*time.Second))
	require.NoError(t, sub.Close())
}
