package redisstore

import (
	"context"
	"fmt"
	"strconv"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
	"github.com/fair-queue/caddy-fair-queue/internal/headsttl"
)

// Adapt implements fairqueue.Adapter with one script.
func (s *Store) Adapt(ctx context.Context, a fairqueue.AdaptArgs) (map[string]float64, error) {
	limited := 0
	if a.Limited {
		limited = 1
	}
	f := func(x float64) string { return strconv.FormatFloat(x, 'g', -1, 64) }
	more := []any{limited, f(a.Floor), f(a.Decrease), f(a.Step), f(a.BreachShare), a.Interval.Milliseconds(), max(a.MinSamples, 1),
		headsttl.Of(fairqueue.HeadsTTL).Milliseconds()}
	for _, r := range a.Reports {
		known := ""
		if k := a.KnownShare(r.Key); k > 0 {
			known = f(k)
		}
		more = append(more, r.Key, r.Samples, r.Over, r.Refused, r.Answered, known)
	}
	u := s.unsure.Load()
	v, err := scripts.adapt.Run(ctx, s.sc, s.keys, s.args(a.Node, fairqueue.Limits{}, more...)...).StringSlice()
	if err != nil {
		return nil, fmt.Errorf("adapt %s: %w", s.tag, s.failed(err))
	}
	s.settled(u)
	shares := make(map[string]float64, len(v)/2)
	for i := 0; i+1 < len(v); i += 2 {
		share, err := strconv.ParseFloat(v[i+1], 64)
		if err != nil {
			return nil, fmt.Errorf("adapt %s: unexpected reply %q", s.tag, v)
		}
		shares[v[i]] = share
	}
	return shares, nil
}

var _ fairqueue.Adapter = (*Store)(nil)
