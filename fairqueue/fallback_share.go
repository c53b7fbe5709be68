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

// deal is the share of a capacity of total that falls to the live node
// of the given rank among n while the store is down, from what the live
// nodes held at its last view (held, by rank; nil: none) and all held
// (by every node, live or not): what the node held, and of the free
// units (total less all held) as many as its deficit, its plain part
// (part from offset) less what it held, dealt to the nodes short of
// their part: one first to each that held nothing, in rank order, then
// the rest in rank order up to each one's deficit. The deficits add up
// to the free units at least, so every free unit is dealt, and none to
// a node at or above its part: the nodes' shares add up to total where
// all held no more than it, as far as their last views agree. A node
// gets 0 only where it held nothing and fewer units were free than
// nodes that held nothing (the capacity saturated at the outage, or
// nearly), or total is fewer than n: the caller gives it one (the
// floor), the only way the shares exceed total. O(n).
//
// Where all held more than total, the excess (all less total) is taken
// off what each node held: the view counted permits that run nowhere (a
// ghost: a heartbeat that reached the store late adopted a fail-open
// permit that had ended, or counted again one released meanwhile) or
// more than total really ran (a lowered capacity: a reload, a learned
// share that came down). Whichever node the ghosts are counted for,
// and however many, the nodes' fallback queues then run no more than
// total between them, nor more than ran then: a node that kept what it
// held would run its ghost's permit for real.
func deal(total, all, offset int, held []int, rank, n int) int {
	at := func(j int) int {
		if j < len(held) {
			return max(held[j], 0)
		}
		return 0
	}
	if excess := all - max(total, 0); excess > 0 {
		return max(min(at(rank), max(total, 0))-excess, 0)
	}
	deficit := func(j int) int { return max(part(total, offset, j, n)-at(j), 0) }
	free := max(total-all, 0)
	// One to each node that held nothing, short of its part.
	got := 0
	for j := 0; j < n && free > 0; j++ {
		if at(j) == 0 && deficit(j) > 0 {
			free--
			if j == rank {
				got = 1
			}
		}
	}
	// The rest up to each one's deficit, in rank order.
	for j := 0; j < n && free > 0; j++ {
		first := 0
		if at(j) == 0 && deficit(j) > 0 {
			first = 1
		}
		more := min(deficit(j)-first, free)
		free -= more
		if j == rank {
			got += more
			break
		}
	}
	return min(at(rank), max(total, 0)) + got
}

// dealtUpstreams is the node's share of each upstream of a pool among
// the n live nodes (it is rank among them), its tokens with it: what it
// held on the upstream at its last view (on; nil: nothing held) and the
// free permits dealt to it (deal), each node's plain part of an
// upstream dealt in turn, in the order of their addresses (the same in
// every node whatever the order they are configured in), so that the
// nodes' parts of an upstream add up to its permits. An upstream none
// of whose permits fall to the node is left out of its fallback queue.
// A node none of the pool's permits fall to (fewer permits than live
// nodes, or the others held all the rest) still gets one (the floor),
// on the upstream the units would deal it next: the fallback queue
// admits at least one request, as without a pool.
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
	total := 0
	for _, i := range order {
		offsets[i] = total
		total += us[i].Permits
	}
	out := make([]Upstream, 0, len(us))
	for i, u := range us {
		h := on[u.Dial]
		if p := deal(u.Permits, h.All, offsets[i], h.By, rank, n); p > 0 {
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
