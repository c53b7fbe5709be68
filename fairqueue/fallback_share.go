package fairqueue

import (
	"cmp"
	"slices"
)

// part is the part of total that falls to the live node of the given
// rank (from 0) among n, dealt one unit at a time from offset on: the
// units offset..offset+total-1 that are rank modulo n. The n parts differ
// by at most one and add up to total, so the nodes' fallback queues
// (each alone while the store is down) admit no more than total between
// them, as far as their last views of the live nodes agree.
func part(total, offset, rank, n int) int {
	if n <= 1 {
		return total
	}
	first := ((rank-offset)%n + n) % n // the first of total's units that is rank's
	if first >= total {
		return 0
	}
	return (total-first-1)/n + 1
}

// share is the node's share of a capacity of total while the store is
// down: what it held (mine) at its last view, and its part (rank among
// n) of what was free then (total less all held, at least 0). The
// nodes' shares add up to total where all held no more than it and
// their last views agree: an instance that held more than its part
// keeps room for those requests, and the others do not take it. Where
// total is fewer than n, a node dealt no unit of the plain deal still
// gets one (part: every node serves, as without anything held).
func share(total, held, mine, rank, n int) int {
	if part(total, 0, rank, n) == 0 {
		return max(min(mine, total), 1)
	}
	return min(mine, total) + part(max(total-held, 0), 0, rank, n)
}

// dealtUpstreams is the node's share of each upstream of a pool among
// the n live nodes (it is rank among them), its tokens with it: what it
// held on the upstream at its last view (on; nil: nothing held) and its
// part of the upstream's permits free then (share). Every upstream's
// free permits are dealt in turn, in the order of their addresses
// (the same in every node whatever the order they are configured in), so
// that the nodes' parts of an upstream add up to its permits and each
// node's parts of the pool to its share of it. An upstream none of
// whose permits fall to the node is left out of its fallback queue. A
// node none of the pool's permits fall to (fewer permits than live
// nodes) still gets one (one that held nothing where the others held
// all the rest gets none: nil), on the upstream the units would deal it next:
// the fallback queue admits at least one request, as without a pool.
func dealtUpstreams(us []Upstream, on map[string]HeldOn, rank, n int) []Upstream {
	if len(us) == 0 {
		return nil
	}
	order := make([]int, len(us))
	for i := range order {
		order[i] = i
	}
	slices.SortStableFunc(order, func(a, b int) int { return cmp.Compare(us[a].Dial, us[b].Dial) })
	offsets := make([]int, len(us))
	total, free := 0, 0
	for _, i := range order {
		offsets[i] = free
		total += us[i].Permits
		free += max(us[i].Permits-on[us[i].Dial].All, 0)
	}
	out := make([]Upstream, 0, len(us))
	for i, u := range us {
		h := on[u.Dial]
		if p := min(h.Mine, u.Permits) + part(max(u.Permits-h.All, 0), offsets[i], rank, n); p > 0 {
			out = append(out, partOf(u, p))
		}
	}
	if len(out) == 0 && total > 0 && rank >= total {
		unit := rank % total
		for i, u := range us {
			if unit >= offsets[i] && unit < offsets[i]+u.Permits {
				out = append(out, partOf(u, 1))
			}
		}
	}
	return out
}

// partOf is upstream u with p of its permits, and as much of its tokens.
func partOf(u Upstream, p int) Upstream {
	d := Upstream{Dial: u.Dial, Permits: p}
	if u.KVTokens > 0 {
		d.KVTokens = max(int(int64(u.KVTokens)*int64(p)/int64(max(u.Permits, 1))), 1)
	}
	return d
}
