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

// dealtUpstreams is the node's part of each upstream of a pool among the
// n live nodes (it is rank among them), its tokens with it: every
// upstream's permits are dealt in turn, in the order of their addresses
// (the same in every node whatever the order they are configured in), so
// that the nodes' parts of an upstream add up to its permits and each
// node's parts of the pool to its share of it. An upstream none of
// whose permits fall to the node is left out of its fallback queue. A
// node none of the pool's permits fall to (fewer permits than live
// nodes) still gets one, on the upstream the units would deal it next:
// the fallback queue admits at least one request, as without a pool.
func dealtUpstreams(us []Upstream, rank, n int) []Upstream {
	if len(us) == 0 {
		return nil
	}
	order := make([]int, len(us))
	for i := range order {
		order[i] = i
	}
	slices.SortStableFunc(order, func(a, b int) int { return cmp.Compare(us[a].Dial, us[b].Dial) })
	offsets := make([]int, len(us))
	total := 0
	for _, i := range order {
		offsets[i] = total
		total += us[i].Permits
	}
	out := make([]Upstream, 0, len(us))
	for i, u := range us {
		if p := part(u.Permits, offsets[i], rank, n); p > 0 {
			out = append(out, partOf(u, p))
		}
	}
	if len(out) == 0 && total > 0 {
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
