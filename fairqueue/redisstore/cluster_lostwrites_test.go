package redisstore_test

import (
	"context"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
	"github.com/fair-queue/caddy-fair-queue/fairqueue/redisstore"
	"github.com/fair-queue/caddy-fair-queue/internal/redistest"
)

// clusterLoseWrites fails the queue's slot over from master to its
// replica so that the replica misses what writes does: the replica is
// frozen and cut from master, writes runs, master is killed, and the
// replica, thawed, takes over (CLUSTER FAILOVER TAKEOVER). It returns
// once every live node names the replica as the slot's owner.
func clusterLoseWrites(t *testing.T, c *redistest.Cluster, master, replica *redistest.Server, tag string, writes func()) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	mc := master.Client(t)
	require.NoError(t, mc.Do(ctx, "WAIT", 1, 5000).Err())
	replica.Freeze()
	require.NoError(t, mc.Do(ctx, "CLIENT", "KILL", "TYPE", "replica").Err())
	writes()
	master.Kill()
	replica.Thaw()
	rc := replica.Client(t, func(o *redis.Options) { o.ReadTimeout = time.Second })
	require.NoError(t, rc.Do(ctx, "CLUSTER", "FAILOVER", "TAKEOVER").Err())
	id, err := rc.ClusterMyID(ctx).Result()
	require.NoError(t, err)
	slot, err := rc.ClusterKeySlot(ctx, tag).Result()
	require.NoError(t, err)
	for _, n := range append(c.Nodes(), replica) {
		if n == master {
			continue
		}
		nc := n.Client(t, func(o *redis.Options) { o.ReadTimeout = time.Second })
		eventually(t, 30*time.Second, func() bool {
			slots, err := nc.ClusterSlots(ctx).Result()
			return err == nil && slices.ContainsFunc(slots, func(s redis.ClusterSlot) bool {
				return int64(s.Start) <= slot && slot <= int64(s.End) && len(s.Nodes) > 0 && s.Nodes[0].ID == id
			})
		}, "%s does not name %s as the owner of slot %d", n.Addr(), replica.Addr(), slot)
	}
}

// A Redis Cluster failover that loses a handoff (the replica takes over
// from a dead master it had not caught up with) keeps the promises of
// the Sentinel case: every waiter is served, within the permits, and
// Redis is left clean. Twice in a row: the old master, restarted, rejoins
// as the new one's replica, and the slot fails back to it.
func TestClusterFailoverLosingAHandoffServesTheBacklog(t *testing.T) {
	cluster := redistest.StartCluster(t, 3)
	tag := redisstore.New(nil, lostName, redisstore.Options{}).Tag()
	master := cluster.SlotOwner(t, tag)
	replica := cluster.AddReplica(t, tag)
	var qs []*fairqueue.Queue
	for range 3 {
		qs = append(qs, openQueue(t, cluster.ClusterClient(t, clusterOpts), lostName, lostCfg))
	}
	admin := cluster.ClusterClient(t, clusterOpts)
	lostHandoffBacklog(t, qs, admin, 2, func(round int, writes func()) {
		clusterLoseWrites(t, cluster, master, replica, tag, writes)
		// Every node's grant channel moves to the new master.
		eventually(t, 10*time.Second, func() bool {
			chs, err := replica.Client(t).PubSubShardChannels(context.Background(), tag+":*").Result()
			return err == nil && len(chs) == len(qs)
		}, "round %d: the nodes never subscribed on the new master", round)
		if round == 0 {
			master.Restart() // rejoins with its identity: the new master's replica
			c := master.Client(t)
			eventually(t, 30*time.Second, func() bool {
				info, _ := c.Info(context.Background(), "replication").Result()
				return strings.Contains(info, "master_port:"+strconv.Itoa(replica.Port())+"\r\n") &&
					strings.Contains(info, "master_link_status:up")
			}, "the old master never became the new one's synced replica")
			master, replica = replica, master
		}
	})
}
