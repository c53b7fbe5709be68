package redistest

import (
	"bytes"
	"context"
	"fmt"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// CLIBinary is the redis-cli executable, looked up in PATH, that joins
// the nodes of a Cluster. Debian ships it in redis-tools, a dependency of
// redis-server; scripts/ensure-redis.sh installs it.
const CLIBinary = "redis-cli"

const (
	// clusterSlots is the number of hash slots of every Redis Cluster.
	clusterSlots = 16384
	// clusterReadyTimeout bounds the wait for a new cluster to agree on
	// its slots; joining takes a second or two.
	clusterReadyTimeout = 30 * time.Second
	// clusterNodeTimeout is each node's cluster-node-timeout: short, so
	// that a test that kills a node sees the cluster notice it soon.
	clusterNodeTimeout = 2 * time.Second
)

// Cluster is a Redis Cluster of masters without replicas, each a Server
// of its own, owned by a test. The slots are split evenly among them.
type Cluster struct {
	nodes    []*Server
	nodeOpts []Option // every node's options, for replicas added later
}

// StartCluster starts masters (at least 3) redis-server processes with
// --cluster-enabled yes on free ports, joins them into one cluster with
// `redis-cli --cluster create ... --cluster-replicas 0 --cluster-yes`,
// and waits until every node reports cluster_state:ok with all slots
// assigned and agrees with the others on who serves which slot. Options
// apply to every node. The nodes are stopped when tb ends.
func StartCluster(tb testing.TB, masters int, opts ...Option) *Cluster {
	tb.Helper()
	if masters < 3 {
		tb.Fatalf("redistest: a Redis Cluster needs at least 3 masters, got %d", masters)
	}
	cli, err := exec.LookPath(CLIBinary)
	if err != nil {
		tb.Fatalf("redistest: %s not found in PATH (%v): run scripts/ensure-redis.sh to install it", CLIBinary, err)
	}
	nodeOpts := append([]Option{WithArgs(
		"--cluster-enabled", "yes",
		// In the node's own --dir, so that a Restart finds it and the
		// node rejoins with its identity and slots.
		"--cluster-config-file", "nodes.conf",
		"--cluster-node-timeout", strconv.FormatInt(clusterNodeTimeout.Milliseconds(), 10),
	)}, opts...)
	c := &Cluster{nodeOpts: nodeOpts}
	for range masters {
		c.nodes = append(c.nodes, Start(tb, nodeOpts...))
	}

	ctx, cancel := context.WithTimeout(context.Background(), clusterReadyTimeout)
	defer cancel()
	args := append([]string{"--cluster", "create"}, c.Addrs()...)
	args = append(args, "--cluster-replicas", "0", "--cluster-yes")
	cmd := exec.CommandContext(ctx, cli, args...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		tb.Fatalf("redistest: %s %s: %v\n%s", CLIBinary, strings.Join(args, " "), err, out.String())
	}
	if err := c.waitReady(ctx); err != nil {
		tb.Fatalf("redistest: cluster %s not ready: %v\n%s", strings.Join(c.Addrs(), ","), err, out.String())
	}
	return c
}

// Addrs returns the host:port of every node, in start order.
func (c *Cluster) Addrs() []string {
	addrs := make([]string, len(c.nodes))
	for i, n := range c.nodes {
		addrs[i] = n.Addr()
	}
	return addrs
}

// Nodes returns the nodes, in start order, for tests that kill, freeze
// or restart one.
func (c *Cluster) Nodes() []*Server { return slices.Clone(c.nodes) }

// ClusterClient returns a go-redis cluster client seeded with every
// node, closed when tb ends. Each opt may change the options before the
// client is made.
func (c *Cluster) ClusterClient(tb testing.TB, opts ...func(*redis.ClusterOptions)) *redis.ClusterClient {
	tb.Helper()
	o := &redis.ClusterOptions{Addrs: c.Addrs()}
	for _, f := range opts {
		f(o)
	}
	rdb := redis.NewClusterClient(o)
	tb.Cleanup(func() { _ = rdb.Close() })
	return rdb
}

// Keys returns the keys matching pattern on every node, sorted: SCAN
// sees one node's keys only, so each is scanned in turn.
func (c *Cluster) Keys(tb testing.TB, pattern string) []string {
	tb.Helper()
	var keys []string
	for _, n := range c.nodes {
		keys = append(keys, n.Keys(tb, pattern)...)
	}
	slices.Sort(keys)
	return slices.Compact(keys)
}

// waitReady polls every node until all report cluster_state:ok, know
// each other and all the slots, and give the same slot map.
func (c *Cluster) waitReady(ctx context.Context) error {
	var clients []*redis.Client
	for _, n := range c.nodes {
		cl := redis.NewClient(&redis.Options{Addr: n.Addr(), DialTimeout: time.Second, ReadTimeout: time.Second, MaxRetries: -1, PoolSize: 1})
		defer cl.Close()
		clients = append(clients, cl)
	}
	var lastErr error
	for {
		if lastErr = c.ready(ctx, clients); lastErr == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w (last: %v)", ctx.Err(), lastErr)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

func (c *Cluster) ready(ctx context.Context, clients []*redis.Client) error {
	var first string
	for i, cl := range clients {
		info, err := cl.ClusterInfo(ctx).Result()
		if err != nil {
			return err
		}
		for _, want := range []string{
			"cluster_state:ok",
			"cluster_slots_assigned:" + strconv.Itoa(clusterSlots),
			"cluster_known_nodes:" + strconv.Itoa(len(clients)),
		} {
			if !strings.Contains(info, want+"\r\n") && !strings.HasSuffix(strings.TrimSpace(info), want) {
				return fmt.Errorf("node %s: no %q in CLUSTER INFO", c.nodes[i].Addr(), want)
			}
		}
		slots, err := cl.ClusterSlots(ctx).Result()
		if err != nil {
			return err
		}
		m := slotMap(slots)
		if i == 0 {
			first = m
		} else if m != first {
			return fmt.Errorf("node %s sees slots %s, node %s sees %s", c.nodes[i].Addr(), m, c.nodes[0].Addr(), first)
		}
	}
	return nil
}

// slotMap renders CLUSTER SLOTS in a canonical form, for comparison.
func slotMap(slots []redis.ClusterSlot) string {
	var parts []string
	for _, s := range slots {
		addr := ""
		if len(s.Nodes) > 0 {
			addr = s.Nodes[0].Addr
		}
		parts = append(parts, fmt.Sprintf("%05d-%05d@%s", s.Start, s.End, addr))
	}
	slices.Sort(parts)
	return strings.Join(parts, " ")
}
