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
			got := dealtUpstreams(pool, nil, r, n)
			assert.ElementsMatch(t, got, dealtUpstreams(reversed, nil, r, n), "%d nodes, rank %d: the order of the upstreams changed the deal", n, r)
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
	assert.Equal(t, []Upstream{{Dial: "a", Permits: 1}}, dealtUpstreams(pool, nil, 6, 8))
	assert.Equal(t, []Upstream{{Dial: "b", Permits: 1, KVTokens: 10}}, dealtUpstreams(pool, nil, 7, 8))
}

// The shares of nodes that held permits unevenly at their last view add
// up to the permits, each keeping room for what it held: 5 permits over
// 3 nodes holding 4, 1 and 0 are 4, 1 and 0 plus the free one dealt, not
// 2, 2 and 1 less each one's own (7 at once).
func TestSharesCountWhatEveryNodeHeld(t *testing.T) {
	for _, held := range [][]int{{4, 1, 0}, {0, 0, 5}, {3, 0, 0}, {1, 1, 1}, {0, 0, 0}} {
		sum := 0
		for r, mine := range held {
			s := share(5, held[0]+held[1]+held[2], mine, r, 3)
			assert.GreaterOrEqual(t, s, mine, "held %v: rank %d keeps no room for its own", held, r)
			sum += s
		}
		assert.Equal(t, 5, sum, "held %v: the shares", held)
	}
	// Per upstream: a holds 2 of 3 permits on node 0, 1 held elsewhere
	// on b (of 3): node 0 keeps 2 on a, the free ones are dealt.
	pool := []Upstream{{Dial: "a", Permits: 3}, {Dial: "b", Permits: 3}}
	on := map[string]HeldOn{"a": {All: 2, Mine: 2}, "b": {All: 1}}
	per := map[string]int{}
	for r := range 2 {
		mine := on
		if r == 1 {
			mine = map[string]HeldOn{"a": {All: 2}, "b": {All: 1, Mine: 1}}
		}
		for _, u := range dealtUpstreams(pool, mine, r, 2) {
			per[u.Dial] += u.Permits
		}
	}
	assert.Equal(t, map[string]int{"a": 3, "b": 3}, per)
}
