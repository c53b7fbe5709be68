package caddyfairqueue

import (
	"sync"
	"sync/atomic"
	"time"
)

// The watches of every request (hangup.go) are looked at by one
// goroutine, which runs while there are any: every hangupEvery it looks
// at the next hangupLooksPerSecond/2 of them in turn, so each is looked
// at every hangupEvery, or every n/hangupLooksPerSecond seconds with n
// watches (more than hangupBatch). A request adds its watch to a list
// and takes it out: no timer and no goroutine of its own.

// hangups is the list of watches running.
var hangups hangupList

type hangupList struct {
	mu      sync.Mutex
	ws      []*hangupWatch
	next    int  // the first of the next turn's batch
	running bool // the goroutine runs
	// count is len(ws), read without mu.
	count atomic.Int64
}

// hangupBatch is how many watches one turn looks at.
const hangupBatch = int(hangupLooksPerSecond * hangupEvery / time.Second)

func (l *hangupList) add(w *hangupWatch) {
	l.mu.Lock()
	w.at = len(l.ws)
	l.ws = append(l.ws, w)
	l.count.Store(int64(len(l.ws)))
	start := !l.running
	l.running = true
	l.mu.Unlock()
	if start {
		go l.sweep()
	}
}

func (l *hangupList) remove(w *hangupWatch) {
	l.mu.Lock()
	defer l.mu.Unlock()
	last := len(l.ws) - 1
	if w.at > last || l.ws[w.at] != w {
		return
	}
	l.ws[w.at] = l.ws[last]
	l.ws[w.at].at = w.at
	l.ws[last] = nil
	l.ws = l.ws[:last]
	l.count.Store(int64(len(l.ws)))
}

// sweep looks at the watches, a batch a turn, until none is left.
func (l *hangupList) sweep() {
	t := time.NewTicker(hangupEvery)
	defer t.Stop()
	batch := make([]*hangupWatch, 0, hangupBatch)
	for range t.C {
		batch = l.nextBatch(batch[:0])
		if batch == nil {
			return
		}
		for i, w := range batch {
			w.look()
			batch[i] = nil
		}
	}
}

// nextBatch appends the watches of this turn to b; nil when there are
// none, and the goroutine ends (the next add starts another).
func (l *hangupList) nextBatch(b []*hangupWatch) []*hangupWatch {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := len(l.ws)
	if n == 0 {
		l.running = false
		if cap(l.ws) > 1024 {
			l.ws = nil // the list of a crowd gone
		}
		return nil
	}
	if l.next >= n {
		l.next = 0
	}
	for range min(n, hangupBatch) {
		b = append(b, l.ws[l.next])
		if l.next++; l.next == n {
			l.next = 0
		}
	}
	return b
}
