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

// Purge, as every call of a Store, ends at its context's deadline with a
// client that ignores contexts (go-redis' default; see
// TestStoreCallsEndAtTheirDeadlineWithAClientThatIgnoresContexts), not
// at the client's read timeout, on a frozen Redis.
func TestPurgeEndsAtItsDeadlineWithAClientThatIgnoresContexts(t *testing.T) {
	srv := redistest.Start(t)
	rdb := srv.Client(t, func(o *redis.Options) { o.ReadTimeout = 10 * time.Second })
	st := redisstore.New(rdb, "chat", redisstore.Options{})
	require.NoError(t, rdb.Ping(context.Background()).Err()) // a connection in the pool

	srv.Freeze()
	t.Cleanup(srv.Thaw)
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	start := time.Now()
	err := st.Purge(ctx)
	took := time.Since(start)
	assert.Error(t, err)
	// The read timeout is 10 s, the deadline 300 ms: 5 s is slack for a
	// loaded machine, not a measure.
	assert.Less(t, took, 5*time.Second, "Purge on a frozen Redis returned after %v (deadline 300ms): %v", took, err)
}
