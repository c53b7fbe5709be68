package caddyfairqueue

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
	"github.com/fair-queue/caddy-fair-queue/fairqueue/memstore"
)

// A live queue counts the running requests of its retired namesakes in
// other stores; not those of another live one (two sites of one config),
// nor those of its own store (the store counts them); a retired one,
// whose waiters moved, counts nothing.
func TestNamesakesCountAcrossAStoreSwitchOnly(t *testing.T) {
	engine := func(data string, running int64, retired bool) *engine {
		e := &engine{name: "ns-test", data: data}
		e.running.Store(running)
		e.tokens.Store(running * 100) // their KV-cache tokens
		namesakes.add(e)
		if retired {
			e.retiredFlag.Store(true)
			namesakes.retired.Add(1)
		}
		t.Cleanup(func() { namesakes.remove(e) })
		return e
	}
	old := engine("local", 3, true)
	cur := engine("redis-a", 1, false)
	other := engine("redis-b", 5, false)
	sameData := engine("redis-a", 7, true)
	assert.Equal(t, 3, cur.reserved())
	assert.Equal(t, 3+7, other.reserved())
	assert.Zero(t, old.reserved())
	assert.Zero(t, sameData.reserved())
	assert.Equal(t, 300, cur.reservedTokens(), "their tokens, alike")
	assert.Equal(t, 300+700, other.reservedTokens())
	assert.Zero(t, old.reservedTokens())
	assert.Same(t, other, namesakes.successor(old), "the newest live one of other data")
	assert.Same(t, other, namesakes.successor(sameData))
	assert.Nil(t, namesakes.successor(cur), "a live queue has none")
	namesakes.remove(old)
	assert.Zero(t, cur.reserved(), "a closed engine counts no more")
	assert.Zero(t, cur.reservedTokens())
}

// A queue whose waiters move answers them, and later ones, at once, and
// acquire reads that as "moved" only while the queue is marked so.
func TestMovedQueueAnswersItsWaiters(t *testing.T) {
	q, err := fairqueue.New(memstore.New(), fairqueue.Config{Name: "moved", Permits: 1, MaxWait: time.Minute})
	require.NoError(t, err)
	t.Cleanup(func() { _ = q.Close() })
	e := &engine{name: "moved", q: q}
	held, err := q.Acquire(context.Background(), fairqueue.Request{})
	require.NoError(t, err)
	defer held.Release()
	waiting := make(chan error, 1)
	go func() {
		_, err := q.Acquire(context.Background(), fairqueue.Request{})
		waiting <- err
	}()
	require.Eventually(t, func() bool { return q.Stats().Waiting == 1 }, 5*time.Second, 5*time.Millisecond)
	e.move()
	assert.ErrorIs(t, <-waiting, fairqueue.ErrShuttingDown)
	assert.True(t, e.moved.Load())
	_, err = q.Acquire(context.Background(), fairqueue.Request{})
	assert.ErrorIs(t, err, fairqueue.ErrShuttingDown, "a later waiter too")
}
