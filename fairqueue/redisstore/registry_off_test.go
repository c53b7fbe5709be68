package redisstore_test

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
	"github.com/fair-queue/caddy-fair-queue/fairqueue/redisstore"
	"github.com/fair-queue/caddy-fair-queue/internal/redistest"
)

// With DeadQueueAfter negative the store leaves the registry alone
// ("not named in the registry"): a Redis user allowed only its queues'
// keys, as a deployment without the registry may grant, runs a queue and
// leaves it without an error, Redis left clean.
func TestAStoreWithoutTheRegistryNeverTouchesIt(t *testing.T) {
	ctx := context.Background()
	srv := redistest.Start(t)
	admin := srv.Client(t)
	require.NoError(t, admin.Do(ctx, "ACL", "SETUSER", "app", "on", ">secret", "~{fair_queue:*", "&*", "+@all").Err())
	rdb := srv.Client(t, func(o *redis.Options) { o.Username, o.Password = "app", "secret" })
	require.Error(t, rdb.ZCard(ctx, redisstore.RegistryKey("")).Err(), "the user may not read the registry")

	q, err := fairqueue.New(redisstore.New(rdb, "chat", redisstore.Options{DeadQueueAfter: -1}),
		fairqueue.Config{Name: "chat", Permits: 1, Lease: time.Second})
	require.NoError(t, err)
	p, err := q.Acquire(ctx, fairqueue.Request{})
	require.NoError(t, err)
	p.Release()
	assert.NoError(t, q.Close(), "the last leave")
	assert.Empty(t, srv.Keys(t, "*"), "keys left after the last instance stopped")
}
