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

// A Redis client made as docs/library.md shows, with go-redis' defaults
// (ContextTimeoutEnabled off: go-redis reads a reply until its own
// ReadTimeout, 5 s, whatever the call's context says): on a frozen Redis,
// Acquire still answers at its max wait and Release returns within the
// store timeout, as the package documentation promises ("store calls are
// bounded"), not after the client's read timeout.
func TestStoreCallsEndAtTheirDeadlineWithAClientThatIgnoresContexts(t *testing.T) {
	srv := redistest.Start(t)
	rdb := srv.Client(t) // go-redis defaults
	q, err := fairqueue.New(redisstore.New(rdb, "chat", redisstore.Options{}),
		fairqueue.Config{Permits: 4, MaxWait: 300 * time.Millisecond, StoreTimeout: 300 * time.Millisecond})
	require.NoError(t, err)
	ctx := context.Background()
	held, err := q.Acquire(ctx, fairqueue.Request{}) // joined while Redis answers
	require.NoError(t, err)

	srv.Freeze()
	t.Cleanup(func() {
		srv.Thaw()
		_ = q.Close()
	})
	start := time.Now()
	p, err := q.Acquire(ctx, fairqueue.Request{})
	took := time.Since(start)
	require.Nil(t, p)
	assert.Error(t, err)
	// The client's read timeout is 5 s; the max wait 300 ms: 3 s is slack
	// for a loaded machine, not a measure.
	assert.Less(t, took, 3*time.Second, "Acquire on a frozen Redis answered after %v (max wait 300ms): %v", took, err)

	start = time.Now()
	held.Release()
	took = time.Since(start)
	assert.Less(t, took, 3*time.Second, "Release on a frozen Redis returned after %v (store timeout 300ms)", took)
}
