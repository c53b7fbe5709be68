package caddyfairqueue

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
)

// A live queue counts the running requests of its retired namesakes in
// other stores; not those of another live one (two sites of one config),
// nor those of its own store (the store counts them); a retired one,
// whose waiters moved, counts nothing.
func TestNamesakesCountAcrossAStoreSwitchOnly(t *testing.T) {
	engine := func(data string, running int64, retired bool) *engine {
		e := &engine{name: "ns-test", data: data}
		e.running.Store(running)
		e.retiredFlag.Store(retired)
		namesakes.add(e)
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
	assert.Same(t, other, namesakes.successor(old), "the newest live one of other data")
	assert.Same(t, other, namesakes.successor(sameData))
	assert.Nil(t, namesakes.successor(cur), "a live queue has none")
	namesakes.remove(old)
	assert.Zero(t, cur.reserved(), "a closed engine counts no more")
}

// A waiter of a queue whose waiters move is told so, also one that
// starts waiting after the move.
func TestMovedQueueEndsItsWaits(t *testing.T) {
	e := &engine{}
	before, stop := e.waitCtx(context.Background())
	defer stop()
	e.move()
	<-before.Done()
	assert.ErrorIs(t, context.Cause(before), errMoved)
	after, stop2 := e.waitCtx(context.Background())
	defer stop2()
	<-after.Done()
	assert.ErrorIs(t, context.Cause(after), errMoved)
}
