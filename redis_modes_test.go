package caddyfairqueue

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/internal/redistest"
)

func TestRedisIdentityIncludesModeAndMasterButNoPassword(t *testing.T) {
	t.Setenv("FQ_TEST_PW", "s3cret")
	t.Setenv("FQ_TEST_SPW", "sentinel-s3cret")
	newB := func(cfg *RedisConfig) *redisBackend {
		b, err := newStore(cfg, caddy.NewReplacer(), nil)
		require.NoError(t, err)
		return b.(*redisBackend)
	}
	sentinel := newB(&RedisConfig{Mode: ModeSentinel, MasterName: "m1", Addresses: []string{"s2:1", "s1:1"},
		Password: "{env.FQ_TEST_PW}", SentinelPassword: "{env.FQ_TEST_SPW}"})
	assert.Equal(t, "sentinel-s3cret", sentinel.sentinelPassword)
	for _, s := range []string{sentinel.storeID(), sentinel.dataID()} {
		assert.NotContains(t, s, "s3cret")
	}
	assert.Equal(t, "redis|sentinel:m1@s1:1,s2:1|db=0|prefix=fair_queue", sentinel.dataID())
	other := newB(&RedisConfig{Mode: ModeSentinel, MasterName: "m2", Addresses: []string{"s1:1", "s2:1"}})
	assert.NotEqual(t, sentinel.storeID(), other.storeID(), "another master is another client")
	assert.NotEqual(t, sentinel.dataID(), other.dataID(), "and other queues")

	cluster := newB(&RedisConfig{Mode: ModeCluster, Addresses: []string{"s1:1", "s2:1"}})
	assert.NotEqual(t, cluster.storeID(), other.storeID())
	assert.Equal(t, "redis|cluster:s1:1,s2:1|db=0|prefix=fair_queue", cluster.dataID())
	single := newB(&RedisConfig{Addresses: []string{"s1:1"}})
	assert.Equal(t, "redis|s1:1|db=0|prefix=fair_queue", single.dataID())

	for _, tc := range []struct {
		b    *redisBackend
		want any
	}{
		{sentinel, (*redis.Client)(nil)}, // a failover client is a *redis.Client
		{cluster, (*redis.ClusterClient)(nil)},
		{single, (*redis.Client)(nil)},
	} {
		c := tc.b.newClient()
		assert.IsType(t, tc.want, c)
		require.NoError(t, c.Close())
	}
}

func TestSentinelModeQueuesOnTheMasterTheSentinelsName(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	s := redistest.StartSentinel(t)
	h := provision(t, newContext(t), "", &Handler{Name: "sentinel", Permits: 1, Redis: &RedisConfig{
		Mode: ModeSentinel, MasterName: s.MasterName(), Addresses: s.SentinelAddrs()[:1],
	}})
	handsOverThePermit(t, h)
	assert.NotEmpty(t, s.Servers()[0].Keys(t, "{fair_queue:sentinel}:*"), "the queue lives on the master")
}

func TestClusterModeQueuesOnARedisCluster(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	seeds := redistest.StartCluster(t, 3).Addrs()
	h := provision(t, newContext(t), "", &Handler{Name: "cluster", Permits: 1, Redis: &RedisConfig{
		Mode: ModeCluster, Addresses: seeds[:1], // one seed finds the others
	}})
	handsOverThePermit(t, h)
}

// handsOverThePermit checks the basic promise on h (1 permit): a second
// request waits for the first and gets its permit when it is done.
func handsOverThePermit(t *testing.T, h *Handler) {
	t.Helper()
	next := newHolder()
	a := newRequest(context.Background(), `{}`).start(h, next)
	next.waitEntered(t)
	require.Equal(t, "granted", a.placeholder(phOutcome))
	b := newRequest(context.Background(), `{}`).start(h, next)
	select {
	case <-next.entered:
		t.Fatal("the second request passed while the only permit was held")
	case <-time.After(200 * time.Millisecond):
	}
	next.release <- struct{}{}
	a.wait(t)
	next.waitEntered(t)
	next.release <- struct{}{}
	b.wait(t)
	assert.Equal(t, "granted", b.placeholder(phOutcome))
	assert.Equal(t, "1", b.placeholder(phPosition))
}

func TestRedisClientSpeaksRESP2UnlessTheURLAsksFor3(t *testing.T) {
	addr := redistest.Start(t).Addr()
	for _, tc := range []struct {
		cfg  *RedisConfig
		resp string
	}{
		{&RedisConfig{Addresses: []string{addr}}, "resp=2"},
		{&RedisConfig{URL: "redis://" + addr + "/0"}, "resp=2"},
		{&RedisConfig{URL: "redis://" + addr + "/0?protocol=3"}, "resp=3"},
	} {
		b, err := newRedisBackend(tc.cfg, caddy.NewReplacer())
		require.NoError(t, err)
		c := b.newClient()
		info, err := c.ClientInfo(context.Background()).Result()
		require.NoError(t, err)
		assert.Equal(t, tc.resp, "resp="+strconv.Itoa(info.Resp), tc.cfg)
		require.NoError(t, c.Close())
	}
	cluster, err := newRedisBackend(&RedisConfig{Mode: ModeCluster, Addresses: []string{"s1:1"}}, caddy.NewReplacer())
	require.NoError(t, err)
	cc := cluster.newClient()
	assert.Equal(t, 2, cc.(*redis.ClusterClient).Options().Protocol, "cluster and sentinel clients too")
	require.NoError(t, cc.Close())
}
