package fairqueue_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
	"github.com/fair-queue/caddy-fair-queue/fairqueue/memstore"
)

func TestWokenMovesAcrossAReleaseThatStartsAWaiterOnly(t *testing.T) {
	t.Parallel()
	store := memstore.New()
	q, err := fairqueue.New(store, fairqueue.Config{Permits: 1, MaxWait: time.Minute})
	require.NoError(t, err)
	t.Cleanup(func() { _ = q.Close() })

	p, err := q.Acquire(context.Background(), fairqueue.Request{})
	require.NoError(t, err)
	before := q.Woken()
	p.Release()
	assert.Equal(t, before, q.Woken(), "nobody waited: nobody woken")

	p, err = q.Acquire(context.Background(), fairqueue.Request{})
	require.NoError(t, err)
	got := make(chan *fairqueue.Permit)
	go func() {
		next, err := q.Acquire(context.Background(), fairqueue.Request{})
		assert.NoError(t, err)
		got <- next
	}()
	// Waiting in the store, not only in the queue's own count (which
	// holds the ticket before the store's answer): a release before the
	// store queues it grants nobody, and the waiter is then granted at
	// once, woken by no grant.
	require.Eventually(t, func() bool { return q.Stats().Waiting == 1 && len(store.State().Waiting) == 1 },
		5*time.Second, time.Millisecond)
	before = q.Woken()
	p.Release()
	assert.Equal(t, before+1, q.Woken(), "the release started the waiter")
	(<-got).Release()
	assert.False(t, q.HeadIsOwn(), "the local store names no head")
}
