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

// A queue whose only instance crashed (no leave) keeps its keys for ever
// when nobody opens it again (a name from the request); purge --dead
// deletes it, and no queue an instance keeps alive.
func TestPurgeDeadDeletesOnlyTheQueuesOfCrashedInstances(t *testing.T) {
	rds := redistest.Start(t)
	ctx := context.Background()
	seed := func(name string, lease time.Duration) *redisstore.Store {
		st := redisstore.New(rds.Client(t), name, redisstore.Options{})
		for _, id := range []string{"n1:1", "n1:2"} { // a holder and a waiter
			_, err := st.Acquire(ctx, fairqueue.TicketArgs{ID: id, Node: "n1", Limits: fairqueue.Limits{Permits: 1, Lease: lease}})
			require.NoError(t, err)
		}
		return st
	}
	crashed := seed("made-up-model", 100*time.Millisecond)
	live := seed("chat", time.Minute)
	kept := rds.Keys(t, live.Tag()+"*")
	time.Sleep(300 * time.Millisecond) // the crashed node's lease is over

	_, err := runCLI(t, "purge", "--dead", "--redis", "redis://"+rds.Addr())
	require.ErrorContains(t, err, "refusing to purge dead queues without --yes")
	require.NotEmpty(t, rds.Keys(t, crashed.Tag()+"*"))

	out, err := runCLI(t, "purge", "--dead", "--dead-for", "1m", "--redis", "redis://"+rds.Addr(), "--yes")
	require.NoError(t, err)
	assert.Equal(t, "0 of 2 queues dead for 1m0s purged\n", out, "dead for 300 ms only")

	out, err = runCLI(t, "purge", "--dead", "--dead-for", "100ms", "--redis", "redis://"+rds.Addr(), "--yes")
	require.NoError(t, err)
	assert.Equal(t, "purged dead queue made-up-model (keys {fair_queue:made-up-model}*)\n1 of 2 queues dead for 100ms purged\n", out)
	assert.Empty(t, rds.Keys(t, crashed.Tag()+"*"), "every key of the dead queue is gone")
	assert.Equal(t, kept, rds.Keys(t, live.Tag()+"*"), "the live queue is untouched")
}
