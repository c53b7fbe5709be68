package caddyfairqueue

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

// The old and the new queue of one name across a store switch count each
// other's running requests; two live queues of one name in different
// stores (two sites of one config) and two engines of one queue (same
// data) do not.
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
	assert.Equal(t, 3, cur.reserved(), "the live queue counts the retired one of other data, not the one of its own (the store counts it), nor another live one")
	assert.Equal(t, 1+5, old.reserved(), "the retired queue counts the live ones of other data")
	assert.Equal(t, 3+7, other.reserved(), "every retired one of other data")
	assert.Equal(t, 5, sameData.reserved(), "the live one of other data")
	namesakes.remove(old)
	assert.Zero(t, cur.reserved(), "a closed engine counts no more")
}
