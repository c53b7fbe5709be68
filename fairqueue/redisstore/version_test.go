package redisstore_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
	"github.com/fair-queue/caddy-fair-queue/fairqueue/redisstore"
	"github.com/fair-queue/caddy-fair-queue/internal/redistest"
)

// A user who may not run INFO (a @dangerous command) still gets sharded
// Pub/Sub on Redis 7: the store reads the version from HELLO, in either
// protocol's reply.
func TestShardedPubSubDetectedWithoutInfo(t *testing.T) {
	srv := redistest.Start(t)
	ctx := context.Background()
	admin := srv.Client(t)
	require.NoError(t, admin.Do(ctx, "ACL", "SETUSER", "fq", "on", ">pw", "~*", "&*", "+@all", "-@dangerous").Err())
	for _, protocol := range []int{2, 3} {
		name := fmt.Sprintf("resp%d", protocol)
		rdb := srv.Client(t, func(o *redis.Options) { o.Username, o.Password, o.Protocol = "fq", "pw", protocol })
		require.Error(t, rdb.Info(ctx, "server").Err(), "the user may run INFO")
		q := openQueue(t, rdb, name, fairqueue.Config{Permits: 1})
		p, err := q.Acquire(ctx, fairqueue.Request{})
		require.NoError(t, err, name)
		p.Release()
		tag := redisstore.New(nil, name, redisstore.Options{}).Tag()
		chs, err := admin.PubSubShardChannels(ctx, tag+":node:*").Result()
		require.NoError(t, err)
		assert.Equal(t, []string{tag + ":node:" + q.Node()}, chs, "shard channels of %s", name)
	}
}
