package fairqueue

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

// A number's turn comes once every number before it passed, in whatever
// order they passed; a wait for a turn that does not come ends at its
// deadline, its context's end or a drain.
func TestMoveLineTurnComesOnceEveryoneBeforeHasPassed(t *testing.T) {
	l := newMoveLine()
	one, two, three := l.take(), l.take(), l.take()
	never := make(chan struct{})
	soon := func() time.Time { return time.Now().Add(50 * time.Millisecond) }

	assert.Equal(t, turnCome, l.wait(context.Background(), one, soon(), never), "the first number waits for nobody")
	assert.Equal(t, turnTimedOut, l.wait(context.Background(), three, soon(), never))
	l.pass(two) // out of order: three still waits for one
	assert.Equal(t, turnTimedOut, l.wait(context.Background(), three, soon(), never))
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	assert.Equal(t, turnCancelled, l.wait(ctx, three, time.Now().Add(time.Hour), never))
	drained := make(chan struct{})
	close(drained)
	assert.Equal(t, turnDrained, l.wait(context.Background(), three, time.Now().Add(time.Hour), drained))

	done := make(chan turnEnd, 1)
	go func() { done <- l.wait(context.Background(), three, time.Now().Add(time.Hour), never) }()
	l.pass(one)
	l.pass(one) // a second pass changes nothing
	assert.Equal(t, turnCome, <-done)
	l.pass(three)
	assert.Empty(t, l.passed, "numbers passed behind the head are kept once it moved past them")
	assert.Equal(t, three, l.head)
}

// A hook (whenPassed) runs once, after the pass that moves the head to
// its number, whatever the order of the passes; at once where the head
// is there already.
func TestMoveLineHookRunsOnceTheHeadReachesItsNumber(t *testing.T) {
	l := newMoveLine()
	one, two, three := l.take(), l.take(), l.take()
	runs := 0
	l.whenPassed(two, func() { runs++ })
	l.pass(two)
	l.pass(three)
	assert.Equal(t, 0, runs, "one has not passed")
	assert.False(t, l.passedTo(two))
	l.pass(one)
	assert.Equal(t, 1, runs)
	assert.True(t, l.passedTo(three))
	l.pass(one)
	assert.Equal(t, 1, runs, "a hook runs once")
	assert.Empty(t, l.hooks)
	l.whenPassed(three, func() { runs++ })
	assert.Equal(t, 2, runs, "the head is there already")
}
