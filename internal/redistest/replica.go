package redistest

import (
	"context"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// replicaTimeout bounds the wait for a replica to join, sync, or take
// over its master.
const replicaTimeout = 30 * time.Second

// AddReplica starts one more cluster node and makes it a replica of the
// master that serves the slot of key, and waits until it has synced and
// every node knows it. It is not among Nodes (which are the masters as
// started); it is stopped when tb ends.
func (c *Cluster) AddReplica(tb testing.TB, key string) *Server {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), replicaTimeout)
	defer cancel()
	r := Start(tb, c.nodeOpts...)
	rc := r.Client(tb, func(o *redis.Options) { o.ReadTimeout = time.Second })
	first := c.nodes[0]
	if err := rc.ClusterMeet(ctx, "127.0.0.1", strings.TrimPrefix(first.Addr(), "127.0.0.1:")).Err(); err != nil {
		tb.Fatalf("redistest: cluster meet: %v", err)
	}
	master := c.SlotOwner(tb, key)
	masterID, err := master.Client(tb).ClusterMyID(ctx).Result()
	if err != nil {
		tb.Fatalf("redistest: cluster myid: %v", err)
	}
	want := len(c.nodes) + 1
	for {
		// REPLICATE needs the replica to know the master first.
		err := rc.ClusterReplicate(ctx, masterID).Err()
		if err == nil {
			break
		}
		if ctx.Err() != nil {
			tb.Fatalf("redistest: cluster replicate %s: %v", master.Addr(), err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	var all []*redis.Client
	for _, n := range append(c.Nodes(), r) {
		all = append(all, n.Client(tb, func(o *redis.Options) { o.ReadTimeout = time.Second }))
	}
	for {
		info, _ := rc.Info(ctx, "replication").Result()
		known := 0
		for _, n := range all {
			ci, _ := n.ClusterInfo(ctx).Result()
			if strings.Contains(ci, "cluster_known_nodes:"+strconv.Itoa(want)+"\r\n") && strings.Contains(ci, "cluster_state:ok") {
				known++
			}
		}
		if strings.Contains(info, "master_link_status:up") && known == want {
			return r
		}
		if ctx.Err() != nil {
			tb.Fatalf("redistest: replica %s of %s not ready: %s", r.Addr(), master.Addr(), info)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Failover makes replica take over its master with CLUSTER FAILOVER (the
// graceful, coordinated kind: the master stops writes until the replica
// caught up) and waits until every node names it as the owner of the
// slot of key.
func (c *Cluster) Failover(tb testing.TB, replica *Server, key string) {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), replicaTimeout)
	defer cancel()
	rc := replica.Client(tb, func(o *redis.Options) { o.ReadTimeout = time.Second })
	if err := rc.ClusterFailover(ctx).Err(); err != nil {
		tb.Fatalf("redistest: cluster failover: %v", err)
	}
	id, err := rc.ClusterMyID(ctx).Result()
	if err != nil {
		tb.Fatalf("redistest: cluster myid: %v", err)
	}
	slot, err := rc.ClusterKeySlot(ctx, key).Result()
	if err != nil {
		tb.Fatalf("redistest: cluster keyslot: %v", err)
	}
	for _, n := range append(c.Nodes(), replica) {
		nc := n.Client(tb, func(o *redis.Options) { o.ReadTimeout = time.Second })
		for {
			slots, err := nc.ClusterSlots(ctx).Result()
			if err == nil && slices.ContainsFunc(slots, func(s redis.ClusterSlot) bool {
				return int64(s.Start) <= slot && slot <= int64(s.End) && len(s.Nodes) > 0 && s.Nodes[0].ID == id
			}) {
				break
			}
			if ctx.Err() != nil {
				tb.Fatalf("redistest: %s does not name %s as the owner of slot %d: %v", n.Addr(), replica.Addr(), slot, err)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
}

// SlotOwner returns the node, among Nodes, that serves the slot of key.
func (c *Cluster) SlotOwner(tb testing.TB, key string) *Server {
	tb.Helper()
	ctx := context.Background()
	cl := c.nodes[0].Client(tb)
	slot, err := cl.ClusterKeySlot(ctx, key).Result()
	if err != nil {
		tb.Fatalf("redistest: cluster keyslot: %v", err)
	}
	slots, err := cl.ClusterSlots(ctx).Result()
	if err != nil {
		tb.Fatalf("redistest: cluster slots: %v", err)
	}
	for _, s := range slots {
		if int64(s.Start) <= slot && slot <= int64(s.End) && len(s.Nodes) > 0 {
			for _, n := range c.nodes {
				if n.Addr() == s.Nodes[0].Addr {
					return n
				}
			}
		}
	}
	tb.Fatalf("redistest: none of the nodes as started serves slot %d", slot)
	return nil
}

// Replicate makes node a replica of master (CLUSTER REPLICATE), as an
// operator rearranging replicas, or Redis' own replica migration, does,
// and waits until it has synced with master.
func (c *Cluster) Replicate(tb testing.TB, node, master *Server) {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), replicaTimeout)
	defer cancel()
	id, err := master.Client(tb).ClusterMyID(ctx).Result()
	if err != nil {
		tb.Fatalf("redistest: cluster myid: %v", err)
	}
	nc := node.Client(tb, func(o *redis.Options) { o.ReadTimeout = time.Second })
	if err := nc.ClusterReplicate(ctx, id).Err(); err != nil {
		tb.Fatalf("redistest: cluster replicate %s: %v", master.Addr(), err)
	}
	for {
		info, _ := nc.Info(ctx, "replication").Result()
		if strings.Contains(info, "master_port:"+strconv.Itoa(master.Port())+"\r\n") && strings.Contains(info, "master_link_status:up") {
			return
		}
		if ctx.Err() != nil {
			tb.Fatalf("redistest: %s not a synced replica of %s: %s", node.Addr(), master.Addr(), info)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
