package redisstore_test

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/fairqueue/redisstore"
	"github.com/fair-queue/caddy-fair-queue/internal/redistest"
)

// A queue the sweep cannot delete (here its liveness key is of another
// type: the script fails) does not keep the sweep from the queues named
// after it: those go, the error is reported, and the failing queue is
// looked at again only after another DeadQueueAfter.
func TestSweepGoesPastAQueueItCannotDelete(t *testing.T) {
	ctx := context.Background()
	srv := redistest.Start(t)
	rdb := srv.Client(t)
	opts := redisstore.Options{DeadQueueAfter: 200 * time.Millisecond}
	crashQueue(t, rdb, "gone", opts)
	reg := redisstore.RegistryKey("")
	require.NoError(t, rdb.Set(ctx, redisstore.TagOf("", "bad")+":nodes", "not a sorted set", 0).Err())
	require.NoError(t, rdb.ZAdd(ctx, reg, redis.Z{Score: 1, Member: "bad"}).Err()) // the oldest
	time.Sleep(time.Second)                                                        // gone's lease, then DeadQueueAfter

	n, err := redisstore.New(rdb, "sweeper", opts).SweepDead(ctx)
	assert.Error(t, err, "the queue that cannot be deleted")
	assert.Equal(t, 1, n, "queues deleted")
	assert.Empty(t, srv.Keys(t, redisstore.TagOf("", "gone")+"*"), "the crashed queue named after the failing one")
	score, err := rdb.ZScore(ctx, reg, "bad").Result()
	require.NoError(t, err)
	assert.Greater(t, score, float64(time.Now().Add(-time.Minute).UnixMilli()), "the failing queue named again")
}
