package memstore

import (
	"context"
	"time"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
)

// adaptState is the learned capacity (fairqueue.Adaptive): the share in
// force and the window of reports since it last moved; guarded by
// Store.mu.
type adaptState struct {
	share                  float64 // 0: 1 (never moved)
	samples, over, refused int
	limited                bool
	moved                  time.Time
}

// Adapt implements fairqueue.Adapter.
func (s *Store) Adapt(_ context.Context, a fairqueue.AdaptArgs) (float64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now()
	st := &s.adaptState
	st.samples += a.Samples
	st.over += a.Over
	st.refused += a.Refused
	st.limited = st.limited || a.Limited
	if st.share == 0 {
		st.share = 1
	}
	if now.Sub(st.moved) >= a.Interval {
		st.share = fairqueue.NextShare(st.share, st.samples, st.over, st.refused, st.limited, a)
		st.samples, st.over, st.refused, st.limited = 0, 0, 0, false
		st.moved = now
	}
	return st.share, nil
}

// scaled is l under the learned share (fairqueue.Limits.Scale).
func (s *Store) scaled(l fairqueue.Limits) fairqueue.Limits {
	return l.Scale(s.share)
}

var _ fairqueue.Adapter = (*Store)(nil)
