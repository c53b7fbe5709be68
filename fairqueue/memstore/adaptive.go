package memstore

import (
	"context"
	"time"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
	"github.com/fair-queue/caddy-fair-queue/internal/headsttl"
)

// adaptState is the learned capacity (fairqueue.Adaptive): each share in
// force and its window of reports since it last moved, by key ("": the
// queue's, else an upstream's dial); guarded by Store.mu.
type adaptState struct {
	shares  map[string]float64
	windows map[string]*adaptWindow
	// headsAt and headsTo are when, and to which node, a release last
	// found the node's own waiters heading the queue under a learned
	// capacity, where the Redis store's reply names them (my_heads in
	// dispatch.lua): another node's report lowers the queue's share no
	// sooner than fairqueue.HeadsTTL after (heldBack), as there. This
	// store takes no local handoffs itself; it holds the same lowerings
	// back, so that both stores move the share alike.
	headsAt time.Time
	headsTo string
}

type adaptWindow struct {
	samples, over, refused, answered int
	limited                          bool
	moved                            time.Time
}

// Adapt implements fairqueue.Adapter.
func (s *Store) Adapt(_ context.Context, a fairqueue.AdaptArgs) (map[string]float64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now()
	if s.left(a.Node, now) {
		// A report sent before its node's leave, come after it, counts
		// nothing (left.go), as in the Redis store (adapt.lua).
		return map[string]float64{}, nil
	}
	if s.shares == nil {
		s.shares, s.windows = make(map[string]float64), make(map[string]*adaptWindow)
	}
	for _, r := range a.Reports {
		if _, ok := s.shares[r.Key]; !ok {
			if k := a.KnownShare(r.Key); k > 0 {
				s.shares[r.Key] = k // a share the store lacks starts from the node's (AdaptArgs.Known)
			}
		}
		w := s.windows[r.Key]
		if w == nil {
			w = &adaptWindow{}
			s.windows[r.Key] = w
		}
		w.samples += r.Samples
		w.over += r.Over
		w.refused += r.Refused
		w.answered += r.Answered
		w.limited = w.limited || a.Limited
		down := fairqueue.Breached(w.samples, w.over, w.refused, a)
		if now.Sub(w.moved) >= a.Interval && fairqueue.Ripe(w.samples, w.refused, w.answered, a) && (!down || r.Key != "" || !s.heldBack(a.Node, now)) {
			share, ok := s.shares[r.Key]
			if !ok {
				share = 1
			}
			s.shares[r.Key] = fairqueue.NextShare(share, w.samples, w.over, w.refused, w.answered, w.limited, a)
			*w = adaptWindow{moved: now}
		}
	}
	out := make(map[string]float64, len(s.shares))
	for k, v := range s.shares {
		// A share below the floor in force (a reload raised it) rises to
		// it now, not at its next move: a window may take MinSamples
		// answers to ripen.
		v = max(v, a.Floor)
		s.shares[k], out[k] = v, v
	}
	return out, nil
}

// heldBack says whether the queue's share may not come down now on
// node's report: heads were named to another node less than
// fairqueue.HeadsTTL ago (noteHeads; the Redis store's adapt.lua).
func (s *Store) heldBack(node string, now time.Time) bool {
	return !s.headsAt.IsZero() && now.Sub(s.headsAt) < headsttl.Of(fairqueue.HeadsTTL) && s.headsTo != node
}

// noteHeads records, after a release of ticket id under l (scaled)
// and its dispatch, whether the Redis store's reply would name heads
// under a learned capacity (my_heads in dispatch.lua): no fair ticket
// waited and no holder was on an upstream before the release (shared:
// the script reads them first), no pool and no tokens in l, no more
// holders than l's permits, the first FIFO waiter is the releasing
// node's, and no other node is in the queue.
func (s *Store) noteHeads(id string, l fairqueue.Limits, shared bool, now time.Time) {
	if !l.Learned || shared || len(l.Upstreams) > 0 || l.Tokens != 0 || l.Permits < 1 ||
		len(s.holders) > l.Permits || len(s.nodes) > 1 || len(s.waiting) == 0 {
		return
	}
	node := fairqueue.TicketNode(id)
	if fairqueue.TicketNode(s.waiting[0].id) != node { // the heap's least seq: the head
		return
	}
	s.headsAt, s.headsTo = now, node
}

// fairWaits reports whether any fair ticket waits.
func (s *Store) fairWaits() bool {
	for _, f := range s.flows {
		if len(f.q) > 0 {
			return true
		}
	}
	return false
}

// scaled is l under the learned shares (fairqueue.Limits.Scale).
func (s *Store) scaled(l fairqueue.Limits) fairqueue.Limits {
	return l.Scale(s.shares)
}

var _ fairqueue.Adapter = (*Store)(nil)
