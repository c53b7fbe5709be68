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
	q, err := fairqueue.New(memstore.New(), fairqueue.Config{Permits: 1, MaxWait: time.Minute})
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
	require.Eventually(t, func() bool { return q.Stats().Waiting == 1 }, 5*time.Second, time.Millisecond)
	before = q.Woken()
	p.Release()
	assert.Equal(t, before+1, q.Woken(), "the release started the waiter")
	(<-got).Release()
	assert.False(t, q.HeadIsOwn(), "the local store names no head")
}
