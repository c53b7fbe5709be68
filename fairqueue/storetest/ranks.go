package storetest

import (
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
)

func init() {
	cases = append(cases, testCase{"HeartbeatsRankTheLiveNodes", ranks})
}

// ranks: once every node's heartbeat has seen the others, the nodes'
// ranks (ClusterView.Rank, the part of the capacity each node's
// fallback queue takes while the store is down) are 0 to n-1, each once.
func ranks(t *testing.T, h Harness) {
	const n = 3
	var qs []*fairqueue.Queue
	for range n {
		q := h.NewNode(t, "ranks", fairqueue.Config{Permits: 1, Lease: 1500 * time.Millisecond, PollInterval: 50 * time.Millisecond})
		p, err := q.Acquire(bg, fairqueue.Request{})
		require.NoError(t, err)
		p.Release()
		qs = append(qs, q)
	}
	var got []int
	eventually(t, 10*time.Second, func() bool {
		got = got[:0]
		for _, q := range qs {
			c := q.Stats().Cluster
			if c.Nodes != n {
				return false
			}
			got = append(got, c.Rank)
		}
		slices.Sort(got)
		return slices.Equal(got, []int{0, 1, 2})
	}, "the nodes' ranks were never 0, 1 and 2, each once")
}
