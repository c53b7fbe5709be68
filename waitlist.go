package caddyfairqueue

import (
	"sync"
	"sync/atomic"
)

// busySeq numbers, in this process, the moments a queue's waiting
// requests go from none to some.
var busySeq atomic.Uint64

// waitList counts the requests waiting in an engine's queue, and numbers
// the stretch of time during which some have waited without a break
// (since): of two namesakes in other stores with waiters, the one whose
// stretch began first grants (see retiredSum). A request leaves the list
// only once its grant is counted in the engine's running requests, so
// that a grant on its way keeps its queue's stretch, and so its turn.
type waitList struct {
	mu    sync.Mutex
	n     int
	since uint64 // with n > 0: the stretch's number
	// by counts the waiting requests by the handler they came through:
	// a waiter keeps its own route where a grant cannot tell it another
	// (handsOnSafely).
	by map[*Handler]int
}

// add lists a waiting request of h; done unlists it.
func (w *waitList) add(h *Handler) (done func()) {
	w.mu.Lock()
	if w.n == 0 {
		// Numbered under the lock: a namesake that reads this list sees
		// either no waiter or this number.
		w.since = busySeq.Add(1)
	}
	w.n++
	if w.by == nil {
		w.by = make(map[*Handler]int)
	}
	w.by[h]++
	w.mu.Unlock()
	return func() { w.done(h) }
}

func (w *waitList) done(h *Handler) {
	w.mu.Lock()
	w.n--
	if w.by[h]--; w.by[h] <= 0 {
		delete(w.by, h)
	}
	w.mu.Unlock()
}

// handlers lists the handlers whose requests wait.
func (w *waitList) handlers() []*Handler {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := make([]*Handler, 0, len(w.by))
	for h := range w.by {
		out = append(out, h)
	}
	return out
}

// busy reports whether requests wait, and since when (the stretch's
// number).
func (w *waitList) busy() (since uint64, ok bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.since, w.n > 0
}
