package storetest

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
)

func init() {
	cases = append(cases, testCase{"LearnedWindowKeepsTheReportsOfANodeThatLeft", learnedWindowLeft})
}

// A window keeps every report since its share last moved until it is
// ripe (docs/adaptive.md, Limits): the reports of a node that left since
// count in it (they are the backend's answers, as the others' are),
// while a report of the node sent before its leave and come after it
// counts nothing.
func learnedWindowLeft(t *testing.T, h Harness) {
	const name = "learnedwindowleft"
	s1, s2 := store(t, h, name, "n1"), store(t, h, name, "n2")
	ad1, ok := s1.(fairqueue.Adapter)
	if !ok {
		t.Skip("the store keeps no learned capacity")
	}
	ad2 := s2.(fairqueue.Adapter)
	l := fairqueue.Limits{Permits: 4, Lease: time.Minute, Learned: true}
	for _, n := range []struct {
		s    fairqueue.Store
		node string
	}{{s1, "n1"}, {s2, "n2"}} {
		_, err := n.s.Acquire(bg, ticket(n.node+":1", n.node, l)) // joins the queue
		require.NoError(t, err)
	}
	report := func(ad fairqueue.Adapter, node string, samples, over int) map[string]float64 {
		shares, err := ad.Adapt(bg, fairqueue.AdaptArgs{Node: node, Reports: []fairqueue.AdaptReport{{Samples: samples, Over: over}},
			Floor: 0.0625, Decrease: 0.5, Step: 0.25, BreachShare: 0.25, Interval: 100 * time.Millisecond, MinSamples: 2})
		require.NoError(t, err)
		return shares
	}
	assert.Empty(t, report(ad1, "n1", 1, 1), "one sample of two: not ripe")
	require.NoError(t, s1.Leave(bg, "n1", l))
	// Counted, its five samples in time would leave one of seven above
	// the target: no breach.
	assert.Empty(t, report(ad1, "n1", 5, 0), "a report come after its node's leave counts nothing")
	time.Sleep(150 * time.Millisecond) // past the interval
	assert.Equal(t, map[string]float64{"": 0.5}, report(ad2, "n2", 1, 0),
		"the window holds n1's breach and n2's sample, not n1's late report: ripe, half of them above the target")
	require.NoError(t, s2.Leave(bg, "n2", l))
}
