package fairqueue

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

// The parts of a total among n nodes add up to it and differ by at most
// one, whatever the offset it is dealt from.
func TestPartsAddUpToTheTotal(t *testing.T) {
	for total := range 12 {
		for n := 1; n <= 5; n++ {
			for off := range 7 {
				sum, lo, hi := 0, total, 0
				for r := range n {
					p := part(total, off, r, n)
					sum += p
					lo, hi = min(lo, p), max(hi, p)
				}
				assert.Equal(t, total, sum, "total %d, %d nodes, offset %d", total, n, off)
				assert.LessOrEqual(t, hi-lo, 1, "total %d, %d nodes, offset %d", total, n, off)
			}
		}
	}
}

// A pool's upstreams dealt among n nodes: each upstream's parts add up
// to its permits, each node's parts to its share of the pool (within
// one of the others'), the same whatever the order the upstreams are
// configured in; a node none of whose permits fall to it gets one.
func TestDealtUpstreamsSplitEachUpstreamAmongTheNodes(t *testing.T) {
	pool := []Upstream{{Dial: "c", Permits: 3, KVTokens: 300}, {Dial: "a", Permits: 1}, {Dial: "b", Permits: 2, KVTokens: 20}}
	reversed := []Upstream{pool[2], pool[1], pool[0]}
	for n := 1; n <= 6; n++ {
		per := map[string]int{}
		tokens := map[string]int{}
		lo, hi := 6, 0
		for r := range n {
			got := dealtUpstreams(pool, r, n)
			assert.ElementsMatch(t, got, dealtUpstreams(reversed, r, n), "%d nodes, rank %d: the order of the upstreams changed the deal", n, r)
			sum := 0
			for _, u := range got {
				per[u.Dial] += u.Permits
				tokens[u.Dial] += u.KVTokens
				sum += u.Permits
			}
			lo, hi = min(lo, sum), max(hi, sum)
			assert.GreaterOrEqual(t, sum, 1, "%d nodes, rank %d got no permit", n, r)
		}
		assert.Equal(t, map[string]int{"a": 1, "b": 2, "c": 3}, per, "%d nodes: the upstreams' parts", n)
		assert.LessOrEqual(t, tokens["c"], 300)
		assert.LessOrEqual(t, tokens["b"], 20)
		assert.LessOrEqual(t, hi-lo, 1, "%d nodes: the nodes' parts of the pool", n)
	}
	// 8 nodes, 6 permits: ranks 6 and 7 get one each, on a and b (units
	// 0 and 1 again).
	assert.Equal(t, []Upstream{{Dial: "a", Permits: 1}}, dealtUpstreams(pool, 6, 8))
	assert.Equal(t, []Upstream{{Dial: "b", Permits: 1, KVTokens: 10}}, dealtUpstreams(pool, 7, 8))
}
