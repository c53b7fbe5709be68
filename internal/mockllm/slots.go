package mockllm

import (
	"context"
	"time"
)

// slotWaiter is a request waiting for one of Config.Slots; got receives
// its arrival time when giveSlot hands it one.
type slotWaiter struct {
	seq string
	got chan time.Time
}

// takeSlot waits for one of Config.Slots, in arrival order, and counts
// the request arrived when it has one (the one who frees the slot does,
// so that arrivals are recorded in the order of the queue). It returns
// the arrival time; false if ctx ended first.
func (s *Server) takeSlot(ctx context.Context, seq string) (time.Time, bool) {
	s.mu.Lock()
	if s.freeSlots > 0 && len(s.slotQueue) == 0 {
		s.freeSlots--
		now := s.arriveLocked(seq)
		s.mu.Unlock()
		return now, true
	}
	w := &slotWaiter{seq: seq, got: make(chan time.Time, 1)}
	s.slotQueue = append(s.slotQueue, w)
	s.stats.Waiting++
	s.mu.Unlock()
	select {
	case now := <-w.got:
		return now, true
	case <-ctx.Done():
	}
	s.mu.Lock()
	for i, q := range s.slotQueue {
		if q == w {
			s.slotQueue = append(s.slotQueue[:i], s.slotQueue[i+1:]...)
			s.stats.Waiting--
			s.mu.Unlock()
			return time.Time{}, false
		}
	}
	s.mu.Unlock()
	// Handed a slot as the client left: it arrived, and leaves at once.
	s.leave(canceled, seq, <-w.got)
	s.giveSlot()
	return time.Time{}, false
}

// giveSlot hands a freed slot to the first request waiting, or frees it.
func (s *Server) giveSlot() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.slotQueue) == 0 {
		s.freeSlots++
		return
	}
	w := s.slotQueue[0]
	s.slotQueue = s.slotQueue[1:]
	s.stats.Waiting--
	w.got <- s.arriveLocked(w.seq)
}
