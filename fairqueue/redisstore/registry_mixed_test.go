package redisstore_test

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

// Two instances of one queue, one that names it in the registry and one
// that does not (DeadQueueAfter negative): when the one without the
// registry leaves last, nothing is left in Redis. Its leave deleted the
// queue's keys but left the name the other had put in the registry, the
// registry's key with it, for good.
func TestTheLastLeaveOfAStoreWithoutTheRegistryLeavesNothing(t *testing.T) {
	srv := redistest.Start(t)
	ctx := context.Background()
	named, err := fairqueue.New(redisstore.New(srv.Client(t), "regmix", redisstore.Options{}), fairqueue.Config{Permits: 1})
	require.NoError(t, err)
	unnamed, err := fairqueue.New(redisstore.New(srv.Client(t), "regmix", redisstore.Options{DeadQueueAfter: -1}), fairqueue.Config{Permits: 1})
	require.NoError(t, err)
	for _, q := range []*fairqueue.Queue{named, unnamed} {
		p, err := q.Acquire(ctx, fairqueue.Request{})
		require.NoError(t, err)
		p.Release()
	}
	require.Eventually(t, func() bool { return len(srv.Keys(t, redisstore.RegistryKey(""))) == 1 },
		10*time.Second, 10*time.Millisecond, "the first instance names the queue in the registry")
	require.NoError(t, named.Close())
	require.NoError(t, unnamed.Close())
	assert.Empty(t, srv.Keys(t, "*"))
}
