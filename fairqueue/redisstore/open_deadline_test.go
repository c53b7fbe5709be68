package redisstore_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/fairqueue/redisstore"
	"github.com/fair-queue/caddy-fair-queue/internal/redistest"
)

// Open ends at its context's deadline with a client that ignores
// contexts (go-redis' defaults, as docs/library.md shows) while Redis
// pauses writes (CLIENT PAUSE WRITE, as a failover does): it reads and
// subscribes, and naming the queue in the registry, a write, must not
// wait out the client's read timeout.
func TestOpenEndsAtItsDeadlineWhileRedisPausesWrites(t *testing.T) {
	srv := redistest.Start(t)
	admin := srv.Client(t)
	s := redisstore.New(srv.Client(t), "chat", redisstore.Options{})
	require.NoError(t, admin.Do(context.Background(), "CLIENT", "PAUSE", "10000", "WRITE").Err())
	t.Cleanup(func() { _ = admin.Do(context.Background(), "CLIENT", "UNPAUSE").Err() })

	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	start := time.Now()
	err := s.Open(ctx, "n1", nopListener{})
	took := time.Since(start)
	t.Cleanup(func() { _ = s.Close() })
	// The client's read timeout is 5 s, the pause 10 s; the deadline
	// 300 ms: 2.5 s is slack for a loaded machine, not a measure.
	assert.Less(t, took, 2500*time.Millisecond, "Open with a 300ms deadline returned after %v: %v", took, err)
}
