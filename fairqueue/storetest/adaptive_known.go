package storetest

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
)

func init() {
	cases = append(cases, testCase{"LearnedShareTheStoreLacksStartsFromTheNodes", learnedKnown})
}

// A share the store lacks (it lost its data: Redis restarted without
// persistence) starts from the one the reporting node last heard of
// (AdaptArgs.Known), not from the ceiling; a share the store has is
// not changed by what a node knows. A report whose window ripens moves
// the share from there.
func learnedKnown(t *testing.T, h Harness) {
	const name = "learnedknown"
	s := store(t, h, name, "n1")
	ad, ok := s.(fairqueue.Adapter)
	if !ok {
		t.Skip("the store keeps no learned capacity")
	}
	l := fairqueue.Limits{Permits: 4, Lease: time.Minute, Learned: true}
	_, err := s.Acquire(bg, ticket("n1:1", "n1", l)) // joins the queue
	require.NoError(t, err)
	args := func(known float64, samples, over int) fairqueue.AdaptArgs {
		return fairqueue.AdaptArgs{Node: "n1", Reports: []fairqueue.AdaptReport{{Samples: samples, Over: over}},
			Floor: 0.0625, Decrease: 0.5, Step: 0.25, BreachShare: 0.01, Interval: time.Hour, MinSamples: 1,
			Known: map[string]float64{"": known}}
	}
	shares, err := ad.Adapt(bg, args(0.25, 0, 0)) // nothing observed: the window cannot move
	require.NoError(t, err)
	assert.Equal(t, map[string]float64{"": 0.25}, shares, "the node's share, where the store had none")
	shares, err = ad.Adapt(bg, args(0.75, 0, 0))
	require.NoError(t, err)
	assert.Equal(t, map[string]float64{"": 0.25}, shares, "a share the store has stays")
	shares, err = ad.Adapt(bg, args(0.75, 1, 1)) // a breach; no move yet since none was made
	require.NoError(t, err)
	assert.Equal(t, map[string]float64{"": 0.125}, shares, "a breach halves the share restored")
	require.NoError(t, s.Leave(bg, "n1", l))
}
