package caddyfairqueue

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
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
	assert.Equal(t, "sentinel-s3cret", sentinel.sPass)
	for _, s := range []string{sentinel.key(), sentinel.location()} {
		assert.NotContains(t, s, "s3cret")
	}
	assert.Equal(t, "redis|sentinel:m1@s1:1,s2:1|db=0|prefix=fair_queue", sentinel.location())
	other := newB(&RedisConfig{Mode: ModeSentinel, MasterName: "m2", Addresses: []string{"s1:1", "s2:1"}})
	assert.NotEqual(t, sentinel.key(), other.key(), "another master is another client")
	assert.NotEqual(t, sentinel.location(), other.location(), "and other queues")

	cluster := newB(&RedisConfig{Mode: ModeCluster, Addresses: []string{"s1:1", "s2:1"}})
	assert.NotEqual(t, cluster.key(), other.key())
	assert.Equal(t, "redis|cluster:s1:1,s2:1|db=0|prefix=fair_queue", cluster.location())
	single := newB(&RedisConfig{Addresses: []string{"s1:1"}})
	assert.Equal(t, "redis|s1:1|db=0|prefix=fair_queue", single.location())

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
	master := redistest.Start(t)
	sentinel := startSentinel(t, "llm-queue", master.Port())
	h := provision(t, newContext(t), "", &Handler{Name: "sentinel", Permits: 1, Redis: &RedisConfig{
		Mode: ModeSentinel, MasterName: "llm-queue", Addresses: []string{sentinel},
	}})
	handsOverThePermit(t, h)
	assert.NotEmpty(t, master.Keys(t, "{fair_queue:sentinel}:*"), "the queue lives on the master")
}

func TestClusterModeQueuesOnARedisCluster(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	seeds := startCluster(t, 3)
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

// startSentinel starts a Redis Sentinel (redis-server --sentinel)
// monitoring the master on 127.0.0.1:masterPort under name, and returns
// its address. It is killed when the test ends.
func startSentinel(t *testing.T, name string, masterPort int) string {
	t.Helper()
	bin, err := exec.LookPath(redistest.Binary)
	require.NoError(t, err)
	dir := t.TempDir()
	port := freePort(t)
	conf := filepath.Join(dir, "sentinel.conf") // Sentinel rewrites it: it must be a file
	require.NoError(t, os.WriteFile(conf, []byte(fmt.Sprintf(
		"port %d\nbind 127.0.0.1\ndir %s\nsentinel monitor %s 127.0.0.1 %d 1\n",
		port, dir, name, masterPort)), 0o644))
	log, err := os.Create(filepath.Join(dir, "sentinel.log"))
	require.NoError(t, err)
	defer log.Close()
	cmd := exec.Command(bin, conf, "--sentinel")
	cmd.Dir, cmd.Stdout, cmd.Stderr = dir, log, log
	require.NoError(t, cmd.Start())
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		if t.Failed() {
			out, _ := os.ReadFile(log.Name())
			t.Logf("sentinel log:\n%s", out)
		}
	})
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	c := redis.NewSentinelClient(&redis.Options{Addr: addr, DialTimeout: 250 * time.Millisecond, MaxRetries: -1})
	defer c.Close()
	require.Eventually(t, func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		got, err := c.GetMasterAddrByName(ctx, name).Result()
		return err == nil && len(got) == 2 && got[1] == strconv.Itoa(masterPort)
	}, 15*time.Second, 50*time.Millisecond, "sentinel not serving")
	return addr
}

// startCluster starts a Redis Cluster of n masters (no replicas), the
// slots split evenly, and returns their addresses once every node
// reports the cluster ok.
func startCluster(t *testing.T, n int) []string {
	t.Helper()
	var nodes []*redistest.Server
	var addrs []string
	for range n {
		s := redistest.Start(t, redistest.WithArgs("--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
			"--cluster-node-timeout", "2000"))
		nodes = append(nodes, s)
		addrs = append(addrs, s.Addr())
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	const slots = 16384
	var clients []*redis.Client
	for i, s := range nodes {
		c := s.Client(t)
		clients = append(clients, c)
		lo, hi := i*slots/n, (i+1)*slots/n-1
		require.NoError(t, c.ClusterAddSlotsRange(ctx, lo, hi).Err())
		if i > 0 {
			require.NoError(t, clients[0].ClusterMeet(ctx, "127.0.0.1", strconv.Itoa(s.Port())).Err())
		}
	}
	require.Eventually(t, func() bool {
		for _, c := range clients {
			info, err := c.ClusterInfo(ctx).Result()
			if err != nil || !strings.Contains(info, "cluster_state:ok") || !strings.Contains(info, "cluster_known_nodes:"+strconv.Itoa(n)) {
				return false
			}
		}
		return true
	}, 30*time.Second, 100*time.Millisecond, "cluster not ok")
	return addrs
}

// freePort returns a loopback TCP port that was free a moment ago.
func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}
