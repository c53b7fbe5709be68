package memstore

import (
	"context"
	"time"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
)

// adaptState is the learned capacity (fairqueue.Adaptive): each share in
// force and its window of reports since it last moved, by key ("": the
// queue's, else an upstream's dial); guarded by Store.mu.
type adaptState struct {
	shares  map[string]float64
	windows map[string]*adaptWindow
	// joined is when a node last joined the queue (was made alive): the
	// queue's share is not lowered within fairqueue.HeadsTTL after, while
	// another node is in the queue, as in the Redis store (heldBack).
	joined time.Time
}

type adaptWindow struct {
	samples, over, refused int
	limited                bool
	moved                  time.Time
}

// Adapt implements fairqueue.Adapter.
func (s *Store) Adapt(_ context.Context, a fairqueue.AdaptArgs) (map[string]float64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now()
	if s.shares == nil {
		s.shares, s.windows = make(map[string]float64), make(map[string]*adaptWindow)
	}
	for _, r := range a.Reports {
		w := s.windows[r.Key]
		if w == nil {
			w = &adaptWindow{}
			s.windows[r.Key] = w
		}
		w.samples += r.Samples
		w.over += r.Over
		w.refused += r.Refused
		w.limited = w.limited || a.Limited
		down := fairqueue.Breached(w.samples, w.over, w.refused, a)
		if now.Sub(w.moved) >= a.Interval && fairqueue.Ripe(w.samples, w.refused, a) && (!down || r.Key != "" || !s.heldBack(a.Node, now)) {
			share, ok := s.shares[r.Key]
			if !ok {
				share = 1
			}
			s.shares[r.Key] = fairqueue.NextShare(share, w.samples, w.over, w.refused, w.limited, a)
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
// node's report: the node is not in the queue, or another node is and a
// node joined less than fairqueue.HeadsTTL ago (the Redis store's
// adapt.lua: a node alone hands on locally to heads named for that long).
func (s *Store) heldBack(node string, now time.Time) bool {
	if _, ok := s.nodes[node]; !ok {
		return true
	}
	return len(s.nodes) >= 2 && now.Sub(s.joined) < fairqueue.HeadsTTL
}

// scaled is l under the learned shares (fairqueue.Limits.Scale).
func (s *Store) scaled(l fairqueue.Limits) fairqueue.Limits {
	return l.Scale(s.shares)
}

var _ fairqueue.Adapter = (*Store)(nil)
