package memstore

import (
	"slices"
	"time"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
)

// A node that left (Leave) is tombstoned, as a cancelled ticket is, in
// s.gone under its ID (a ticket's ID holds a colon, a node's none), as
// the Redis store does (left in lua/common.lua): a call of the node that
// reaches the store after its leave (sent before it, late: nothing in
// process makes one, the contract's cases do) changes nothing. The leave
// gave back every permit of the node; such a call would count permits,
// queue waiters and bring the node back to life for nobody.

// leftTTL is how long a node that left stays tombstoned: as long as the
// Redis store keeps it (redisstore.TombstoneTTL).
const leftTTL = 30 * time.Second

// markLeft tombstones node, which leaves.
func (s *Store) markLeft(node string, now time.Time) {
	s.gone[node] = now.Add(leftTTL)
}

// left reports whether node, not alive, left less than leftTTL ago.
func (s *Store) left(node string, now time.Time) bool {
	if s.alive(node, now) {
		return false
	}
	exp, ok := s.gone[node]
	return ok && exp.After(now)
}

// view is the cluster's view a heartbeat of node answers, node's rank
// among the live nodes in the order of their IDs with it, and what each
// live node holds, in all and on each upstream of node's pool, as
// heartbeat.lua answers it.
func (s *Store) view(node string, pool []fairqueue.Upstream, now time.Time) fairqueue.ClusterView {
	v := fairqueue.ClusterView{Waiting: len(s.index), Holders: len(s.holders), TokensHeld: s.held, LeaseExpirations: s.expired}
	var live []string
	for n, exp := range s.nodes {
		if !exp.Before(now) {
			live = append(live, n)
			v.Nodes++
			if n < node {
				v.Rank++
			}
		}
	}
	slices.Sort(live)
	rank := make(map[string]int, len(live))
	for i, n := range live {
		rank[n] = i
	}
	held, tokens := make([]int, len(live)), make([]int, len(live))
	on, anywhere := map[string][]int{}, make([]int, len(live))
	some := false
	for id := range s.holders {
		r, ok := rank[fairqueue.TicketNode(id)]
		if !ok {
			continue
		}
		some = true
		held[r]++
		tokens[r] += s.weight[id]
		if up, ok := s.holderOn[id]; ok {
			if on[up] == nil {
				on[up] = make([]int, len(live))
			}
			on[up][r]++
		} else {
			anywhere[r]++
		}
	}
	if some {
		v.HeldBy, v.TokensBy = held, tokens
	}
	if len(pool) > 0 {
		all := max(len(s.holders)-len(s.holderOn), 0)
		v.OnUpstreams = make(map[string]fairqueue.HeldOn, len(pool))
		for _, u := range pool {
			h := fairqueue.HeldOn{All: s.inflight[u.Dial] + all}
			by, has := make([]int, len(live)), false
			for r := range live {
				by[r] = anywhere[r]
				if on[u.Dial] != nil {
					by[r] += on[u.Dial][r]
				}
				has = has || by[r] > 0
			}
			if has {
				h.By = by
			}
			v.OnUpstreams[u.Dial] = h
		}
	}
	return v
}
