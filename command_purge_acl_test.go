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

// A Redis user granted the queues' keys but not the registry's (the ACL
// documented before the registry: ~{fair_queue:* alone) cannot purge:
// both purges fail before deleting anything, and the error names the
// key the user lacks, so that the operator knows which to grant.
func TestPurgeWithoutRightsOnTheRegistryNamesItAndDeletesNothing(t *testing.T) {
	rds := redistest.Start(t)
	ctx := context.Background()
	require.NoError(t, rds.Client(t).Do(ctx, "ACL", "SETUSER", "fq", "on", ">s", "resetkeys", "resetchannels",
		"~{fair_queue:*", "&{fair_queue:*", "+@all", "-@dangerous").Err())
	st := redisstore.New(rds.Client(t), "chat", redisstore.Options{})
	require.NoError(t, st.Open(ctx, "n1", nopListener{})) // names the queue in the registry
	_, err := st.Acquire(ctx, fairqueue.TicketArgs{ID: "n1:1", Node: "n1", Limits: fairqueue.Limits{Permits: 1, Lease: 100 * time.Millisecond}})
	require.NoError(t, err)
	require.NoError(t, st.Close()) // crashed: no leave
	time.Sleep(300 * time.Millisecond)
	kept := rds.Keys(t, "*")

	url := "redis://fq:s@" + rds.Addr()
	for _, args := range [][]string{{"--queue", "chat"}, {"--dead", "--dead-for", "100ms"}} {
		_, err := runCLI(t, append([]string{"purge", "--redis", url, "--yes"}, args...)...)
		require.Error(t, err, "%v", args)
		assert.ErrorContains(t, err, "NOPERM", "%v", args)
		assert.ErrorContains(t, err, redisstore.RegistryKey(""), "%v: the key the user lacks", args)
	}
	assert.Equal(t, kept, rds.Keys(t, "*"), "nothing was deleted")
}
