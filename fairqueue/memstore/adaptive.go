package memstore

import (
	"context"
	"time"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
)

// adaptState is the learned capacity (fairqueue.Adaptive): each share in
// force and its window of reports since it last moved, by key ("": the
// queue's, else an upstream's dial); guarded by Store.mu.
//
// No lowering is held back, where the Redis store holds one back while
// heads a reply named under a learned share may still serve local
// handoffs (adapt.lua): this store takes no local handoffs (it is no
// fairqueue.Transferrer) and names no heads, so none are ever live.
type adaptState struct {
	shares  map[string]float64
	windows map[string]*adaptWindow
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
		if now.Sub(w.moved) >= a.Interval && fairqueue.Ripe(w.samples, w.refused, a) {
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

// scaled is l under the learned shares (fairqueue.Limits.Scale).
func (s *Store) scaled(l fairqueue.Limits) fairqueue.Limits {
	return l.Scale(s.shares)
}

var _ fairqueue.Adapter = (*Store)(nil)
