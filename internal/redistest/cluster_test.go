package redistest

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestStartClusterSpreadsSlotsOverEveryMaster(t *testing.T) {
	t.Parallel()
	c := StartCluster(t, 3)
	require.Len(t, c.Addrs(), 3)
	rdb := c.ClusterClient(t)
	ctx := context.Background()

	for i := range 300 {
		require.NoError(t, rdb.Set(ctx, fmt.Sprintf("k%d", i), i, 0).Err())
	}
	// Every master got some of the keys: the slots are split.
	for _, n := range c.Nodes() {
		keys := n.Keys(t, "k*")
		assert.NotEmpty(t, keys, "node %s holds no key", n.Addr())
		info, err := n.Client(t).ClusterInfo(ctx).Result()
		require.NoError(t, err)
		assert.Contains(t, info, "cluster_state:ok")
	}
	assert.Len(t, c.Keys(t, "k*"), 300)

	// A hash tag keeps keys in one slot, as a queue's keys are kept.
	require.NoError(t, rdb.Eval(ctx, `redis.call('SET', KEYS[1], 1); return redis.call('INCR', KEYS[2])`,
		[]string{"{q}:a", "{q}:b"}).Err())
}

func TestStartClusterServesShardedPubSub(t *testing.T) {
	t.Parallel()
	c := StartCluster(t, 3)
	rdb := c.ClusterClient(t)
	ctx := context.Background()
	sub := rdb.SSubscribe(ctx, "{q}:node:1")
	defer sub.Close()
	_, err := sub.Receive(ctx) // the subscription confirmation
	require.NoError(t, err)
	n, err := rdb.SPublish(ctx, "{q}:node:1", "hello").Result()
	require.NoError(t, err)
	assert.Equal(t, int64(1), n)
	msg, err := sub.ReceiveMessage(ctx)
	require.NoError(t, err)
	assert.Equal(t, "hello", msg.Payload)
}

func TestStartClusterRefusesFewerThanThreeMasters(t *testing.T) {
	tb := &fatalTB{TB: t}
	done := make(chan struct{})
	go func() {
		defer close(done)
		StartCluster(tb, 2)
		t.Error("StartCluster returned with 2 masters")
	}()
	<-done
	assert.Contains(t, tb.msg, "at least 3 masters")
}

func TestStartSentinelMonitorsMasterWithReplica(t *testing.T) {
	t.Parallel()
	s := StartSentinel(t)
	require.Len(t, s.SentinelAddrs(), 3)
	assert.Equal(t, s.Servers()[0].Addr(), s.MasterAddr())
	rdb := s.FailoverClient(t)
	ctx := context.Background()
	require.NoError(t, rdb.Set(ctx, "k", "v", 0).Err())
	// The replica has it too.
	replica := s.Servers()[1].Client(t)
	require.Eventually(t, func() bool { return replica.Get(ctx, "k").Val() == "v" }, 5*time.Second, 10*time.Millisecond)
}

func TestKillMasterFailsOverToTheReplica(t *testing.T) {
	t.Parallel()
	s := StartSentinel(t)
	rdb := s.FailoverClient(t, func(o *redis.FailoverOptions) {
		o.DialTimeout, o.ReadTimeout, o.MaxRetries = 250*time.Millisecond, 250*time.Millisecond, -1
	})
	ctx := context.Background()
	require.NoError(t, rdb.Set(ctx, "before", "failover", 0).Err())
	// WAIT: the replica acknowledged the write, so the failover keeps it.
	// (Short WAITs: the client's read timeout is 250ms and the replica may
	// still be syncing.)
	require.Eventually(t, func() bool {
		n, err := rdb.Do(ctx, "WAIT", 1, 100).Int()
		return err == nil && n >= 1
	}, 10*time.Second, 10*time.Millisecond, "the replica never acknowledged the write")

	old := s.MasterAddr()
	start := time.Now()
	addr := s.KillMaster()
	t.Logf("failover from %s to %s took %v", old, addr, time.Since(start).Round(time.Millisecond))
	assert.NotEqual(t, old, addr)
	assert.Equal(t, s.Servers()[1].Addr(), addr)
	assert.Equal(t, addr, s.MasterAddr())

	// The failover client follows the new master.
	require.Eventually(t, func() bool {
		return rdb.Get(ctx, "before").Val() == "failover" && rdb.Set(ctx, "after", 1, 0).Err() == nil
	}, 10*time.Second, 50*time.Millisecond)
	info, err := s.Servers()[1].Client(t).Info(ctx, "replication").Result()
	require.NoError(t, err)
	assert.True(t, strings.Contains(info, "role:master"), info)
}
