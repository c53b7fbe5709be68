package fairqueue

import (
	"errors"
	"time"
)

// A grant of the store read while the node serves from its fallback
// queue (Queue.inFallback): the store is back, or was never marked down
// (one failed call opened the fallback queue), but the heartbeat that
// has it count the fallback queue's permits (retireLocal) has not run.
// A waiter of the node still queued in the store (not moved out: the
// store was not marked down, or its acquire was answered as it was) may
// be granted then, by a release that reached the store late: run, it
// would run beside the local permits, above the permits. Its permit is
// given back instead, and its request waits in the fallback queue, then
// in the store's once the local permits are counted, as a request whose
// acquire the store answered then does (backToFallback).

// errGrantInFallback ends the wait of a ticket the store granted while
// the node serves from its fallback queue (uncountedGrant): its permit
// was given back, and its request waits in the fallback queue.
var errGrantInFallback = errors.New("fair queue: granted while serving from the fallback queue")

// served hands t's grant to its caller, unless it must not run
// (uncountedGrant): then it is given back, its flow charged nothing, and
// errGrantInFallback sends its request to the fallback queue.
func (q *Queue) served(t *ticket, start time.Time) (*Permit, error) {
	if q.uncountedGrant(t) {
		q.giveBack(t)
		return nil, errGrantInFallback
	}
	return q.permit(t, start), nil
}

// uncountedGrant reports whether t, granted by the store, would run
// beside the fallback queue's permits uncounted: the node serves from
// its fallback queue, which does not count t among the store's requests
// running (granted before it opened: storeRunning). Read under localMu,
// as localQueue opens the fallback queue: a grant made before it opened
// is counted there, one made after is found here.
func (q *Queue) uncountedGrant(t *ticket) bool {
	if t.failOpen {
		return false
	}
	q.localMu.Lock()
	defer q.localMu.Unlock()
	if q.local == nil {
		return false
	}
	r := q.running.Load()
	return r == nil || !r.has(t.id)
}

// has reports whether ticket id's request is counted.
func (s *storeRunning) has(id string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	_, ok := s.reqs[id]
	return ok
}
