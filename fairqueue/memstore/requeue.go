package memstore

import (
	"container/heap"
	"context"
	"time"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
)

// release ends id's hold, if it holds a permit: the correction goes to
// its flow's counter. It reports whether id held one (a release sent
// again finds no holder and changes nothing).
func (s *Store) release(id string, correction float64) bool {
	if _, ok := s.holders[id]; !ok {
		return false
	}
	s.unhold(id, correction)
	return true
}

// Requeue implements fairqueue.Store. The new ticket is queued before
// Old's permit is given back, so that a flow whose only ticket is the
// requeued one stays active and keeps its counter (less the correction)
// instead of starting again as a newcomer. A grant the dispatch makes to
// the new ticket reaches its node's Listener, as every dispatched grant.
func (s *Store) Requeue(_ context.Context, t fairqueue.RequeueArgs) (fairqueue.AcquireResult, error) {
	out := pending{}
	defer out.deliver()
	s.mu.Lock()
	defer s.mu.Unlock()
	t.Limits = s.scaled(t.Limits)
	now := s.now()
	res := fairqueue.AcquireResult{Epoch: s.epoch, Seq: t.Seq}
	if s.left(t.Node, now) { // late, after its leave: changes nothing
		res.Gone = true
		return res, nil
	}
	if !s.alive(t.Node, now) {
		s.join(t.Node, t.Lease, t.Limits.Upstreams, now)
	}
	inCap := t.MaxInFlightPerTenant
	var w *waiter
	known, ran := true, false
	if exp, ok := s.gone[t.ID]; ok && exp.After(now) {
		res.Gone = true
	} else if _, ok := s.holders[t.ID]; ok {
		res.Granted, res.Upstream = true, s.holderOn[t.ID]
	} else if w = s.index[t.ID]; w == nil && s.requeued(t.Old, now) {
		// A copy of a requeue that ran, whose new ticket ended since.
		ran, res.Gone = true, true
	} else if w == nil {
		known = false
		w = &waiter{id: t.ID, seq: t.Seq, cost: t.Cost, tokens: t.Tokens, asks: t.Asks}
		s.seq = max(s.seq, t.Seq) // a store that lost its data numbers on after it
		if name := fairqueue.TicketFlow(t.ID); name != "" {
			s.enqueue(w, name, inCap)
		} else {
			heap.Push(&s.waiting, w)
			s.index[t.ID] = w
		}
	}
	if !ran {
		s.gone[requeuedKey(t.Old)] = now.Add(requeuedTTL)
	}
	s.markFreed(t.Old, t.Tombstone, t.Lease, now)
	// The upstream refused the request: the first send cools it, whether
	// or not Old still holds its permit (as redisstore's requeue, whose
	// Redis may have lost it); one sent again (the new ticket known, Old
	// holding nothing) does not extend the cooldown.
	if s.release(t.Old, t.Correction) || !known {
		s.cool(t.Cool, t.CoolFor, false, now)
	}
	s.reapAndDispatch(t.Node, t.Limits, now, out)
	res.Grants = s.grants
	if _, held := s.holders[t.ID]; held && known && w != nil {
		// Sent again, its ticket waiting, and granted by this call's
		// dispatch: it answers as the ticket now stands (requeue.lua).
		res.Granted, res.Upstream = true, s.holderOn[t.ID]
	} else if w != nil {
		res.Position = 1 // granted by this dispatch: it was next
		if _, queued := s.index[t.ID]; queued {
			res.Position = s.position(w, inCap)
		}
	}
	return res, nil
}

// A requeue tombstones the ticket it gives back, as requeue.lua does in
// K.gone, for requeuedTTL: a copy of the requeue that comes after its
// new ticket ended (granted and released; go-redis sends a command again
// after a read timeout, and the first send may run last: nothing in
// process makes one, the contract's cases do) finds that it ran, and
// queues the new ticket no more, for a request nobody waits for, nor
// cools its upstream again; an acquire of the given-back ticket that
// comes late changes nothing either. The tombstone lives in s.gone under
// requeuedKey, apart from a ticket's own: a mark of a permit freed
// (markFreed) keeps a heartbeat from counting it again, which a requeue
// alone does not (the Redis store keeps those in K.freed).

// requeuedTTL is how long a ticket a requeue gave back stays tombstoned:
// as long as the Redis store keeps it (redisstore.TombstoneTTL).
const requeuedTTL = 30 * time.Second

// requeuedKey is the key in s.gone of the tombstone of ticket id, given
// back by a requeue: no ticket's or node's ID starts with a NUL byte.
func requeuedKey(id string) string { return "\x00requeued " + id }

// requeued reports whether a requeue gave ticket id back less than
// requeuedTTL ago.
func (s *Store) requeued(id string, now time.Time) bool {
	exp, ok := s.gone[requeuedKey(id)]
	return ok && exp.After(now)
}

// tombstoned reports whether an acquire of ticket id changes nothing:
// it was cancelled with a tombstone, marked freed, or given back by a
// requeue, that recently.
func (s *Store) tombstoned(id string, now time.Time) bool {
	exp, ok := s.gone[id]
	return (ok && exp.After(now)) || s.requeued(id, now)
}
