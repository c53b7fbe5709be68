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

// Close called from two goroutines at once (a deferred Close and a
// signal handler's): each returns once the node has left, so a program
// that closes its Redis client as soon as Close returns leaves nothing
// behind. Before, the second Close returned at once while the first was
// still leaving; the client closed under it, the leave failed and the
// node's permits stayed held in Redis for a lease, other nodes' requests
// waiting on them.
func TestConcurrentClosesReturnOnceTheNodeHasLeft(t *testing.T) {
	srv := redistest.Start(t)
	admin := srv.Client(t)
	rdb := srv.Client(t)
	q, err := fairqueue.New(redisstore.New(rdb, "chat", redisstore.Options{}), fairqueue.Config{Permits: 1, MaxWait: time.Second})
	require.NoError(t, err)
	_, err = q.Acquire(context.Background(), fairqueue.Request{}) // held at exit
	require.NoError(t, err)

	done := make(chan error, 2)
	go func() { done <- q.Close() }()
	go func() { done <- q.Close() }()
	first := <-done
	_ = rdb.Close() // the program's client, closed once the Queue is
	second := <-done
	assert.NoError(t, first)
	assert.NoError(t, second)
	st := readState(t, admin, "chat")
	assert.Empty(t, st.Holders, "the closed node's permit, still held in Redis")
	assert.Empty(t, st.Nodes, "the closed node, still a member")

	other, err := fairqueue.New(redisstore.New(admin, "chat", redisstore.Options{}), fairqueue.Config{Permits: 1, MaxWait: time.Second})
	require.NoError(t, err)
	t.Cleanup(func() { _ = other.Close() })
	p, err := other.Acquire(context.Background(), fairqueue.Request{})
	require.NoError(t, err, "another node's request, beside no permit held")
	p.Release()
}
