package caddyfairqueue

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

// nopListener receives nothing: the crashed instance's grants.
type nopListener struct{}

func (nopListener) Granted(...fairqueue.Grant) {}
func (nopListener) Resynced()                  {}

// When every instance under a prefix crashed, purge --dead is what
// cleans up (docs/operations.md): it leaves nothing in Redis, not even
// the registry naming the queues it deleted. A name with a brace in it
// (its keys' tag holds "_" instead) goes from the registry too.
func TestPurgeDeadTakesThePurgedQueuesOutOfTheRegistry(t *testing.T) {
	rds := redistest.Start(t)
	ctx := context.Background()
	for _, name := range []string{"made-up-model", "odd{name}"} {
		st := redisstore.New(rds.Client(t), name, redisstore.Options{})
		require.NoError(t, st.Open(ctx, "n1", nopListener{})) // names the queue in the registry
		for _, id := range []string{"n1:1", "n1:2"} {         // a holder and a waiter
			_, err := st.Acquire(ctx, fairqueue.TicketArgs{ID: id, Node: "n1", Limits: fairqueue.Limits{Permits: 1, Lease: 100 * time.Millisecond}})
			require.NoError(t, err)
		}
		require.NoError(t, st.Close()) // crashed: no leave
	}
	require.NotEmpty(t, rds.Keys(t, redisstore.RegistryKey("")), "the instance named its queues")
	time.Sleep(300 * time.Millisecond) // the crashed node's lease is over

	out, err := runCLI(t, "purge", "--dead", "--dead-for", "100ms", "--redis", "redis://"+rds.Addr(), "--yes")
	require.NoError(t, err)
	assert.Contains(t, out, "2 of 2 queues dead for 100ms purged\n")
	assert.Empty(t, rds.Keys(t, "*"), "keys left after purge --dead deleted every queue")
}

// purge --queue, run after the queue's instances all crashed, leaves
// nothing of it in Redis either: its name goes from the registry.
func TestPurgeQueueTakesItOutOfTheRegistry(t *testing.T) {
	rds := redistest.Start(t)
	ctx := context.Background()
	st := redisstore.New(rds.Client(t), "made-up-model", redisstore.Options{})
	require.NoError(t, st.Open(ctx, "n1", nopListener{}))
	_, err := st.Acquire(ctx, fairqueue.TicketArgs{ID: "n1:1", Node: "n1", Limits: fairqueue.Limits{Permits: 1, Lease: time.Minute}})
	require.NoError(t, err)
	require.NoError(t, st.Close()) // crashed: no leave

	_, err = runCLI(t, "purge", "--queue", "made-up-model", "--redis", "redis://"+rds.Addr(), "--yes")
	require.NoError(t, err)
	assert.Empty(t, rds.Keys(t, "*"), "keys left after purge --queue")
}

// On a Redis Cluster purge --dead reaches the node it connects to; the
// registry may live on another: purging there still works, the
// registry left alone.
func TestPurgeDeadOnAClusterNodeThatDoesNotServeTheRegistry(t *testing.T) {
	c := redistest.StartCluster(t, 3)
	ctx := context.Background()
	st := redisstore.New(c.ClusterClient(t), "made-up-model", redisstore.Options{})
	require.NoError(t, st.Open(ctx, "n1", nopListener{}))
	_, err := st.Acquire(ctx, fairqueue.TicketArgs{ID: "n1:1", Node: "n1", Limits: fairqueue.Limits{Permits: 1, Lease: 100 * time.Millisecond}})
	require.NoError(t, err)
	require.NoError(t, st.Close()) // crashed: no leave
	time.Sleep(300 * time.Millisecond)

	for _, addr := range c.Addrs() {
		_, err := runCLI(t, "purge", "--dead", "--dead-for", "100ms", "--redis", "redis://"+addr, "--yes")
		require.NoError(t, err, "purge --dead on %s", addr)
	}
	assert.Empty(t, c.Keys(t, st.Tag()+"*"), "the dead queue's keys")
}
