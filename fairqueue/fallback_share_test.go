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
			s := deal(5, held[0]+held[1]+held[2], 0, held, r, 3)
			assert.GreaterOrEqual(t, s, mine, "held %v: rank %d keeps no room for its own", held, r)
			sum += s
		}
		assert.Equal(t, 5, sum, "held %v: the shares", held)
	}
	// Per upstream: node 0 holds 2 of a's 3 permits, node 1 1 of b's 3:
	// each keeps what it holds, the free ones are dealt.
	pool := []Upstream{{Dial: "a", Permits: 3}, {Dial: "b", Permits: 3}}
	on := map[string]HeldOn{"a": {All: 2, By: []int{2, 0}}, "b": {All: 1, By: []int{0, 1}}}
	per := map[string]int{}
	for r := range 2 {
		for _, u := range dealtUpstreams(pool, on, r, 2) {
			per[u.Dial] += u.Permits
		}
	}
	assert.Equal(t, map[string]int{"a": 3, "b": 3}, per)
}

// The free permits go to the nodes short of their plain part, up to
// their deficit: every way 1 to 4 live nodes (and some permits held by
// a node gone) can hold up to 7 permits of 0 to 6, the shares keep what
// each held, add up to the permits (less the gone node's) wherever all
// held no more than them, give no free permit to a node at or above its
// part, none to a node that held none while a free one is left for each
// such node, and, with the floor of one for a node dealt none, exceed
// the permits by at most the number of such nodes (the gone node's
// requests counted: they still run). Where all held more, see
// TestDealTakesTheExcessOffWhatEachHeld.
func TestDealGivesTheFreePermitsByDeficit(t *testing.T) {
	for n := 1; n <= 4; n++ {
		for total := 0; total <= 6; total++ {
			for gone := 0; gone <= 2; gone++ {
				held := make([]int, n)
				for {
					all := gone
					for _, h := range held {
						all += h
					}
					sum, floored, zeros, none := 0, 0, 0, 0
					for r := range n {
						if held[r] == 0 && part(total, 0, r, n) > 0 {
							none++
						}
					}
					for r := range n {
						s := deal(total, all, 0, held, r, n)
						if all <= total { // else the excess comes off (TestDealTakesTheExcessOffWhatEachHeld)
							assert.GreaterOrEqual(t, s, held[r], "%d permits, held %v (+%d gone): rank %d lost its own", total, held, gone, r)
						}
						if all <= total && held[r] >= part(total, 0, r, n) {
							assert.Equal(t, min(held[r], total), s, "%d permits, held %v (+%d gone): rank %d at its part %d got free ones", total, held, gone, r, part(total, 0, r, n))
						}
						sum += s
						if s == 0 {
							zeros++
							if part(total, 0, r, n) > 0 && !assert.Less(t, total-all, none,
								"%d permits, held %v (+%d gone): rank %d got none with a free permit for each node that held none", total, held, gone, r) {
								return
							}
						}
						floored += max(s, 1)
					}
					// The gone node's requests still run: the shares are
					// the rest.
					if all <= total && (!assert.Equal(t, total-gone, sum, "%d permits, held %v (+%d gone): the shares", total, held, gone) ||
						!assert.LessOrEqual(t, floored+gone, total+zeros, "%d permits, held %v (+%d gone): the floored shares", total, held, gone)) {
						return
					}
					// The next holdings, each node 0..total+1.
					i := 0
					for ; i < n; i++ {
						if held[i]++; held[i] <= total+1 {
							break
						}
						held[i] = 0
					}
					if i == n {
						break
					}
				}
			}
		}
	}
	// Skewed: 4 permits over 2 nodes, node 1 holding all 4: node 0 gets
	// none (the floor then gives it one); node 1 keeps 4. With 3 held by
	// node 0 of its part 2: the free one goes to node 1.
	assert.Equal(t, 0, deal(4, 4, 0, []int{0, 4}, 0, 2))
	assert.Equal(t, 4, deal(4, 4, 0, []int{0, 4}, 1, 2))
	assert.Equal(t, 3, deal(4, 3, 0, []int{3, 0}, 0, 2))
	assert.Equal(t, 1, deal(4, 3, 0, []int{3, 0}, 1, 2))
	// 5 permits over 3 nodes (parts 2, 2, 1), node 1 holding 3: the 2
	// free go one to each node that held none, not both to rank 0 (its
	// deficit) and none to rank 2.
	for r, want := range []int{1, 3, 1} {
		assert.Equal(t, want, deal(5, 3, 0, []int{0, 3, 0}, r, 3), "rank %d", r)
	}
}

// Where the last view counted more permits held than the capacity (a
// ghost: a late heartbeat adopted a fail-open permit that had ended, or
// counted again one released meanwhile; or a capacity lowered below what
// ran), the fallback queues together run no more than the capacity, nor
// more than ran then: whichever node the excess was counted for (its
// ghosts: none of them runs), the requests running during the outage
// (each node's share, or what it still runs where that is more) are at
// most the permits, or what really ran where that was more. Before,
// each node kept what it held: 4 permits, instances holding 3 (one a
// ghost) and 2 kept 3 and 2, and 5 requests ran at once.
func TestDealTakesTheExcessOffWhatEachHeld(t *testing.T) {
	for n := 1; n <= 4; n++ {
		for total := 0; total <= 6; total++ {
			for gone := 0; gone <= 2; gone++ {
				held := make([]int, n)
				for {
					all := gone
					for _, h := range held {
						all += h
					}
					if all > total {
						shares := make([]int, n)
						for r := range n {
							shares[r] = deal(total, all, 0, held, r, n)
						}
						for j := range n { // the excess counted for node j
							ran, running := gone, gone
							for r := range n {
								real := held[r]
								if r == j {
									real = max(held[r]-(all-total), 0)
								}
								ran += real
								running += max(shares[r], real)
							}
							if !assert.LessOrEqual(t, running, max(total, ran),
								"%d permits, held %v (+%d gone), the excess counted for rank %d: shares %v", total, held, gone, j, shares) {
								return
							}
						}
					}
					i := 0
					for ; i < n; i++ {
						if held[i]++; held[i] <= total+2 {
							break
						}
						held[i] = 0
					}
					if i == n {
						break
					}
				}
			}
		}
	}
	assert.Equal(t, 2, deal(4, 5, 0, []int{3, 2}, 0, 2), "the instance the ghost is counted for")
	assert.Equal(t, 1, deal(4, 5, 0, []int{3, 2}, 1, 2))
}
