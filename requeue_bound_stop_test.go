package caddyfairqueue

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

// The bound of a held answer (heldBound) whose timer fired as next
// returned, its function run only once stop had reported the
// forwarding uncut, cuts nothing: the request goes on as uncut (it may
// be requeued, and forwarded again with the same context), and a cut
// then would end it as if its client had left (c.left): its held answer
// passed on as nothing, its requeue cancelled.
func TestAHeldBoundStoppedUncutCutsNothingAfterwards(t *testing.T) {
	var cuts atomic.Int32
	c := &call{cut: func() { cuts.Add(1) }}
	b := &heldBound{c: c, end: time.Now().Add(time.Hour)}
	b.timer = time.AfterFunc(time.Hour, b.fire)
	b.hold() // before the end of the wait: nothing is cut
	late := b.stop()
	assert.False(t, late)
	// The timer's function, started as the wait ended just before stop
	// stopped the timer, runs now.
	b.fire()
	assert.Equal(t, int32(0), cuts.Load(), "the bound cut the forwarding after stop reported it uncut")
}
