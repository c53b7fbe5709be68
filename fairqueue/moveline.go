package fairqueue

import (
	"context"
	"sync"
	"time"
)

// moveLine keeps the order of a fallback queue's waiters as they move
// into the store's queue once the store is back (retireLocal): each
// request takes a number as it enters the fallback queue, and a moving
// one sends its acquire once every request numbered before it has
// passed: queued in the store's queue (or again in a fallback queue),
// granted, or gone. Moving at once, each on its own goroutine, they
// would join the store's queue in the order their calls happened to
// reach it.
type moveLine struct {
	mu     sync.Mutex
	taken  uint64              // the numbers handed out: 1 to taken
	head   uint64              // every number up to head has passed
	passed map[uint64]struct{} // the numbers beyond head that passed
	moved  chan struct{}       // closed, and replaced, when head moves on
	hooks  []lineHook          // run once head reaches their number (whenPassed)
	sent   map[uint64]struct{} // the numbers not passed yet of requests gone to the store's queue in their turn (toStore)
}

// lineHook is a function to run once every number up to n has passed.
type lineHook struct {
	n uint64
	f func()
}

func newMoveLine() *moveLine {
	return &moveLine{passed: make(map[uint64]struct{}), moved: make(chan struct{})}
}

// take numbers a request entering the fallback queue; it must pass its
// number once, whatever its end, or those behind it wait until their
// own deadline.
func (l *moveLine) take() uint64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.taken++
	return l.taken
}

// takeN numbers k requests entering the fallback queue together, in
// turn, and returns the first of their numbers (the others follow it).
func (l *moveLine) takeN(k int) uint64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	first := l.taken + 1
	l.taken += uint64(k)
	return first
}

// extend is takeN for k requests that come while requests numbered
// before them are still to pass (moving in): they go behind those; false,
// and no number, once all passed, or while a request of the line gone to
// the store's queue in its turn has not passed (toStore).
func (l *moveLine) extend(k int) (uint64, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.head >= l.taken || len(l.sent) > 0 {
		return 0, false
	}
	first := l.taken + 1
	l.taken += uint64(k)
	return first, true
}

// toStore notes that the request numbered n, whose turn came, went to
// the store's queue instead (the store was back; or the fallback queue it
// entered retired): its number passes once it queues there. The line
// does not go on (extend) while such a number has not passed: the
// request's call failing, the store marked down again, the request
// came back behind the requests numbered after it, which waited for it
// (joinExit): each waited for the other until its max wait, a request
// moving in from the retired fallback queue ahead of it too
// (joinMovers), and the fallback queue granted none of them.
func (l *moveLine) toStore(n uint64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if _, passed := l.passed[n]; n > l.head && !passed {
		if l.sent == nil {
			l.sent = make(map[uint64]struct{})
		}
		l.sent[n] = struct{}{}
	}
}

// join numbers a request that comes while requests numbered before it
// are still to pass (moving in); false, and no number, once all passed.
func (l *moveLine) join() (uint64, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.head >= l.taken {
		return 0, false
	}
	l.taken++
	return l.taken, true
}

// joinMovers puts a request that reaches the store's queue, other than
// one moving in from line from, behind the waiters of the fallback queue
// retired last that are still moving in (Queue.moving): it came after
// them. It returns that line and the request's number in it, or nil
// once every one of them has passed, and the line is forgotten.
func (q *Queue) joinMovers(from *moveLine) (*moveLine, uint64) {
	l := q.moving.Load()
	if l == nil || l == from {
		return nil, 0
	}
	if n, ok := l.join(); ok {
		return l, n
	}
	q.moving.CompareAndSwap(l, nil)
	return nil, 0
}

// pass lets the requests behind n go; a second pass of n does nothing.
// The hooks (whenPassed) the pass reaches run after it, outside the
// line's lock.
func (l *moveLine) pass(n uint64) {
	var due []lineHook
	defer func() {
		for _, h := range due {
			h.f()
		}
	}()
	l.mu.Lock()
	defer l.mu.Unlock()
	if n <= l.head {
		return
	}
	delete(l.sent, n)
	l.passed[n] = struct{}{}
	head := l.head
	for {
		if _, ok := l.passed[head+1]; !ok {
			break
		}
		delete(l.passed, head+1)
		head++
	}
	if head != l.head {
		l.head = head
		close(l.moved)
		l.moved = make(chan struct{})
		due = l.reached()
	}
}

// reached takes out, and returns, the hooks whose number the head has
// reached (with l.mu held).
func (l *moveLine) reached() []lineHook {
	var due []lineHook
	keep := l.hooks[:0]
	for _, h := range l.hooks {
		if h.n <= l.head {
			due = append(due, h)
		} else {
			keep = append(keep, h)
		}
	}
	l.hooks = keep
	return due
}

// whenPassed runs f once every number up to n has passed: at once if
// they have, or else after the pass that moves the head to n.
func (l *moveLine) whenPassed(n uint64, f func()) {
	l.mu.Lock()
	if l.head < n {
		l.hooks = append(l.hooks, lineHook{n: n, f: f})
		l.mu.Unlock()
		return
	}
	l.mu.Unlock()
	f()
}

// passedTo reports whether every number up to n has passed.
func (l *moveLine) passedTo(n uint64) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.head >= n
}

// turnEnd is how a wait for a turn ended.
type turnEnd int

const (
	turnCome turnEnd = iota
	turnCancelled
	turnTimedOut
	turnDrained
)

// wait blocks until every request numbered before n has passed, or
// ctx ends, deadline passes or drain closes.
func (l *moveLine) wait(ctx context.Context, n uint64, deadline time.Time, drain <-chan struct{}) turnEnd {
	var timer *time.Timer
	defer func() {
		if timer != nil {
			timer.Stop()
		}
	}()
	for {
		l.mu.Lock()
		head, moved := l.head, l.moved
		l.mu.Unlock()
		if head >= n-1 {
			return turnCome
		}
		if timer == nil {
			timer = time.NewTimer(time.Until(deadline))
		}
		select {
		case <-moved:
		case <-ctx.Done():
			return turnCancelled
		case <-timer.C:
			return turnTimedOut
		case <-drain:
			return turnDrained
		}
	}
}
