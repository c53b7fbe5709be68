package caddyfairqueue

import (
	"container/heap"
	"sync"
	"sync/atomic"
)

// waitSeq numbers the requests of this process in the order they first
// wait for a permit; a request that moves to another queue keeps its
// number.
var waitSeq atomic.Uint64

// waitList is the requests waiting in an engine's queue, each by its
// number: which one waits longest (see retiredSum). A request leaves it
// only once its grant is counted in the engine's running requests.
type waitList struct {
	mu sync.Mutex
	h  seqHeap
}

// waitEntry is one request in a waitList.
type waitEntry struct {
	seq uint64
	i   int // its index in the heap
}

// add puts a request numbered seq in the list.
func (w *waitList) add(seq uint64) *waitEntry {
	x := &waitEntry{seq: seq}
	w.mu.Lock()
	heap.Push(&w.h, x)
	w.mu.Unlock()
	return x
}

// remove takes x out of the list.
func (w *waitList) remove(x *waitEntry) {
	w.mu.Lock()
	heap.Remove(&w.h, x.i)
	w.mu.Unlock()
}

// oldest is the number of the request waiting longest; ok is false when
// none waits.
func (w *waitList) oldest() (seq uint64, ok bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.h) == 0 {
		return 0, false
	}
	return w.h[0].seq, true
}

// seqHeap is a min-heap of waitEntries by seq (container/heap).
type seqHeap []*waitEntry

func (h seqHeap) Len() int           { return len(h) }
func (h seqHeap) Less(i, j int) bool { return h[i].seq < h[j].seq }
func (h seqHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].i, h[j].i = i, j
}

func (h *seqHeap) Push(x any) {
	e := x.(*waitEntry)
	e.i = len(*h)
	*h = append(*h, e)
}

func (h *seqHeap) Pop() any {
	old := *h
	e := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	return e
}
