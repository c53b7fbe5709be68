package caddyfairqueue

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
	"github.com/fair-queue/caddy-fair-queue/fairqueue/redisstore"
	"github.com/fair-queue/caddy-fair-queue/internal/redistest"
)

// On a Redis Cluster the queues spread over the masters by their hash
// tag. The CLI, given any one node, works on the whole cluster as the
// instances do: status lists every master's queues, purge --queue
// reaches a queue another node serves (no MOVED), and purge --dead
// deletes the dead queues of every master and their registry names.
func TestCLIOnARedisClusterWorksOnEveryMaster(t *testing.T) {
	c := redistest.StartCluster(t, 3)
	ctx := context.Background()
	var names []string
	owner := map[string]string{} // queue -> address of the node serving it
	for i := range 9 {
		name := fmt.Sprintf("q%d", i)
		names = append(names, name)
		st := redisstore.New(c.ClusterClient(t), name, redisstore.Options{})
		require.NoError(t, st.Open(ctx, "n1", nopListener{})) // names the queue in the registry
		_, err := st.Acquire(ctx, fairqueue.TicketArgs{ID: "n1:1", Node: "n1", Limits: fairqueue.Limits{Permits: 1, Lease: 100 * time.Millisecond}})
		require.NoError(t, err)
		require.NoError(t, st.Close()) // crashed: no leave
		for _, n := range c.Nodes() {
			if len(n.Keys(t, st.Tag()+"*")) > 0 {
				owner[name] = n.Addr()
			}
		}
	}
	served := map[string]bool{}
	for _, a := range owner {
		served[a] = true
	}
	require.Greater(t, len(served), 1, "the queues are spread over several masters: %v", owner)
	time.Sleep(300 * time.Millisecond) // the crashed node's leases are over

	for _, addr := range c.Addrs() {
		out, err := runCLI(t, "status", "--redis", "redis://"+addr)
		require.NoError(t, err, "status on %s", addr)
		for _, name := range names {
			assert.Regexp(t, `(?m)^`+name+`\s+redis `, out, "status on %s lists %s (served by %s)", addr, name, owner[name])
		}
	}

	var other string // a queue the first node does not serve
	for _, name := range names {
		if owner[name] != c.Addrs()[0] {
			other = name
			break
		}
	}
	out, err := runCLI(t, "purge", "--queue", other, "--redis", "redis://"+c.Addrs()[0], "--yes")
	require.NoError(t, err, "purge --queue %s on %s", other, c.Addrs()[0])
	assert.Contains(t, out, fmt.Sprintf("purged queue %q", other))
	assert.Empty(t, c.Keys(t, redisstore.TagOf("", other)+"*"), "the purged queue's keys")

	out, err = runCLI(t, "purge", "--dead", "--dead-for", "100ms", "--redis", "redis://"+c.Addrs()[0], "--yes")
	require.NoError(t, err)
	assert.Contains(t, out, "8 of 8 queues dead for 100ms purged\n")
	assert.Empty(t, c.Keys(t, "*"), "keys left on the cluster after purge --dead")
}
