package memstore

import (
	"cmp"
	"maps"
	"slices"
	"time"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
)

// Upstream pools (Limits.Upstreams), the rules the Redis store's Lua
// scripts follow too:
//
//   - A grant needs, besides a free pool permit, an eligible upstream:
//     one of the calling node's list with fewer holders than its Permits
//     and not cooling. A holder counts on its upstream whatever list it
//     was granted under, also on an upstream no longer listed (which
//     gets no new grants). A holder granted without a pool (before a
//     reload added one) may run on any upstream: it counts on every one.
//   - A waiter of another node without a pool (its last heartbeat named
//     none: a rolling change that adds one) is granted on none, counted
//     on every upstream, and only while every upstream has a free permit
//     (and room for its weight), cooling or not: its request runs on its
//     route's static upstream, which may be any of them (pickWaiter).
//     Meanwhile it keeps its place; in fair order a later ready flow's
//     head may pass it, as one whose weight does not fit (candidate,
//     tokens.go), with or without tokens.
//   - Among the eligible, the one with the largest free share
//     (Permits - in flight) / Permits wins, compared exactly; ties go to
//     the one whose last grant is oldest by the grant counter, never
//     granted first, then list order.
//   - With tokens, an upstream is eligible only where the grant's
//     weight fits (tokens.go), and when every upstream counts tokens the
//     free share compared is of their tokens.
//   - A release (or requeue) naming a cooling upstream keeps it out of
//     dispatch until now + CoolFor, the later end winning. A release
//     whose ticket holds nothing (sent again; or, in Redis, its permit
//     lost with the data) cools it only if it is not cooling: one sent
//     again does not extend the cooldown. One sent again that comes
//     after the cooldown ended cools it once more: nothing of a permit
//     is kept once it is given back, so it cannot be told from a release
//     whose permit Redis lost, which must cool it (a trace of it would be
//     a write on each handoff with a cooldown). A requeue cools it when
//     its old ticket held a permit or its new ticket is unknown (its
//     first send); one sent again after the new ticket was granted and
//     released finds the old ticket's tombstone (requeue.go) and cools
//     nothing, as it queues nothing.
//   - When the queue is empty everywhere after a leave, the pool state
//     (cooldowns, last grants) goes with it.
//   - What is kept of an upstream (its last grant, its learned share)
//     goes once no node has it in its pool, as their heartbeats name
//     them (poolOf).

// poolState is the store's upstream pool state; guarded by Store.mu.
type poolState struct {
	holderOn map[string]string    // holder ticket -> its upstream
	inflight map[string]int       // upstream -> holders on it (no zero entries)
	lastNo   map[string]int64     // upstream -> grant counter of its last grant
	cooling  map[string]time.Time // upstream -> end of its cooldown
}

func newPoolState() poolState {
	return poolState{holderOn: make(map[string]string), inflight: make(map[string]int),
		lastNo: make(map[string]int64), cooling: make(map[string]time.Time)}
}

// pickFor returns the upstream a grant of w tokens made now goes to, ""
// when l has no pool; ok is false when the pool has no eligible upstream
// or the tokens do not fit (tokens.go).
func (s *Store) pickFor(l fairqueue.Limits, now time.Time, w int) (dial string, ok bool) {
	if !s.fitsQueue(l, w) {
		return "", false
	}
	if len(l.Upstreams) == 0 {
		return "", true
	}
	anywhere := max(len(s.holders)-len(s.holderOn), 0)
	var best *fairqueue.Upstream
	for i := range l.Upstreams {
		u := &l.Upstreams[i]
		if s.inflight[u.Dial]+anywhere >= u.Permits || s.coolingAt(u.Dial, now) || !s.fitsOn(l, u, w) {
			continue
		}
		if best == nil || s.before(l, u, best, anywhere) {
			best = u
		}
	}
	if best == nil {
		return "", false
	}
	return best.Dial, true
}

// bare reports whether node is another node than self without a pool
// (its last heartbeat named none: in Redis, a rolling change that adds
// one), or whose pool is not known (in Redis, lost with its key): its
// request runs on its route's static upstream, which may be any of the
// pool.
func (s *Store) bare(node, self string) bool {
	return node != self && len(s.pools[node]) == 0
}

// pickWaiter is pickFor for waiter w, granted by node self: a waiter of
// a bare node counts on every upstream once granted, so it needs room
// on every one (the upstream returned is the one pickFor chose, which
// its grant does not name).
func (s *Store) pickWaiter(l fairqueue.Limits, now time.Time, self string, w *waiter) (dial string, ok bool) {
	weight := w.weight(l)
	dial, ok = s.pickFor(l, now, weight)
	if !ok || dial == "" || !s.bare(fairqueue.TicketNode(w.id), self) {
		return dial, ok
	}
	anywhere := max(len(s.holders)-len(s.holderOn), 0)
	for i := range l.Upstreams {
		u := &l.Upstreams[i]
		if s.inflight[u.Dial]+anywhere >= u.Permits || !s.fitsOn(l, u, weight) {
			return dial, false
		}
	}
	return dial, true
}

// before reports whether a is served before b: the larger free share (of
// its tokens when every upstream counts them, byTokens; else of its
// permits), then the older
// last grant (anywhere: the holders that count on every upstream).
// Integer cross-multiplication keeps the comparison exact; a tie of both
// (never granted) keeps list order.
func (s *Store) before(l fairqueue.Limits, a, b *fairqueue.Upstream, anywhere int) bool {
	fa := int64(a.Permits-s.inflight[a.Dial]-anywhere) * int64(b.Permits)
	fb := int64(b.Permits-s.inflight[b.Dial]-anywhere) * int64(a.Permits)
	if byTokens(l) {
		at := s.anywhereTokens()
		fa = int64(a.KVTokens-s.onUp[a.Dial]-at) * int64(b.KVTokens)
		fb = int64(b.KVTokens-s.onUp[b.Dial]-at) * int64(a.KVTokens)
	}
	if fa != fb {
		return fa > fb
	}
	return s.lastNo[a.Dial] < s.lastNo[b.Dial]
}

func (s *Store) coolingAt(dial string, now time.Time) bool {
	end, ok := s.cooling[dial]
	return ok && end.After(now)
}

// granted records the grant numbered no of ticket id on upstream dial
// (nothing without a pool).
func (s *Store) granted(id, dial string, no int64) {
	if dial == "" {
		return
	}
	s.holdOn(id, dial)
	s.lastNo[dial] = no
}

// holdOn counts holder id on upstream dial; a holder entry created
// outside a grant (a heartbeat re-adding or adopting it) takes only this.
func (s *Store) holdOn(id, dial string) {
	if dial == "" {
		return
	}
	if _, ok := s.holderOn[id]; ok {
		return
	}
	s.holderOn[id] = dial
	s.inflight[dial]++
}

// unholdOn frees id's slot on its upstream, if it has one.
func (s *Store) unholdOn(id string) {
	dial, ok := s.holderOn[id]
	if !ok {
		return
	}
	delete(s.holderOn, id)
	if s.inflight[dial]--; s.inflight[dial] <= 0 {
		delete(s.inflight, dial)
	}
}

// cool keeps upstream dial out of dispatch until now+d, unless it cools
// longer already; idle: only if it is not cooling at all now.
func (s *Store) cool(dial string, d time.Duration, idle bool, now time.Time) {
	if dial == "" || d <= 0 || idle && s.cooling[dial].After(now) {
		return
	}
	if end := now.Add(d); end.After(s.cooling[dial]) {
		s.cooling[dial] = end
	}
}

// pruneCooling forgets the cooldowns that ended.
func (s *Store) pruneCooling(now time.Time) {
	for dial, end := range s.cooling {
		if !end.After(now) {
			delete(s.cooling, dial)
		}
	}
}

// upstreamsOf maps the holders of node that run on an upstream to it
// (nil when none does).
func (s *Store) upstreamsOf(node string) map[string]string {
	var m map[string]string
	for id, dial := range s.holderOn {
		if fairqueue.TicketNode(id) == node {
			if m == nil {
				m = make(map[string]string)
			}
			m[id] = dial
		}
	}
	return m
}

// upstreamInfos lists the upstreams with holders or cooling, by dial.
func (s *Store) upstreamInfos(now time.Time) []fairqueue.UpstreamInfo {
	var out []fairqueue.UpstreamInfo
	for dial, n := range s.inflight {
		out = append(out, fairqueue.UpstreamInfo{Dial: dial, InFlight: n, TokensHeld: s.onUp[dial]})
	}
	for dial, end := range s.cooling {
		if !end.After(now) {
			continue
		}
		if i := slices.IndexFunc(out, func(u fairqueue.UpstreamInfo) bool { return u.Dial == dial }); i >= 0 {
			out[i].CoolLeft = end.Sub(now)
		} else {
			out = append(out, fairqueue.UpstreamInfo{Dial: dial, CoolLeft: end.Sub(now)})
		}
	}
	slices.SortFunc(out, func(a, b fairqueue.UpstreamInfo) int { return cmp.Compare(a.Dial, b.Dial) })
	return out
}

// poolOf records node's pool, ups, as its heartbeat names it, and forgets
// what is kept per upstream (its learned share and window, its last
// grant) for the upstreams no node of the queue has in its pool: a
// reload that drops an upstream leaves nothing of it once every node has
// it, and a node still on the old pool (a rolling change) keeps its
// upstreams' shares. Nothing goes while a node has named no pool (its
// entry unknown): it may use any. The Redis store's pool_forget (pool.lua).
func (s *Store) poolOf(node string, ups []fairqueue.Upstream) {
	s.pools[node] = dialsOf(ups)
	keep := make(map[string]bool)
	for n := range s.nodes {
		p, ok := s.pools[n]
		if !ok {
			return
		}
		for _, d := range p {
			keep[d] = true
		}
	}
	gone := func(dial string) bool { return dial != "" && !keep[dial] }
	maps.DeleteFunc(s.lastNo, func(dial string, _ int64) bool { return gone(dial) })
	maps.DeleteFunc(s.shares, func(dial string, _ float64) bool { return gone(dial) })
	maps.DeleteFunc(s.windows, func(dial string, _ *adaptWindow) bool { return gone(dial) })
}

// forgetIfEmpty drops the pool state and the count of passes
// (tokens.go) when the queue is empty everywhere: no waiter, no holder,
// no node.
func (s *Store) forgetIfEmpty() {
	if len(s.index) == 0 && len(s.holders) == 0 && len(s.nodes) == 0 {
		s.poolState = newPoolState()
		s.passes = 0 // as K.tpass goes with the queue's keys in Redis
	}
}

// byTokens reports whether l's upstreams are compared by their free
// tokens: tokens are counted and every upstream sets KVTokens.
func byTokens(l fairqueue.Limits) bool {
	if l.Tokens == 0 {
		return false
	}
	for _, u := range l.Upstreams {
		if u.KVTokens <= 0 {
			return false
		}
	}
	return true
}

// dialsOf is the dials of ups, in order: a node's pool as s.pools keeps
// it. The call that makes a node alive records it too (Acquire,
// Requeue), before its first heartbeat, as the Redis store does: another
// node's dispatch grants a waiter of a node without a pool on none.
func dialsOf(ups []fairqueue.Upstream) []string {
	dials := make([]string, len(ups))
	for i, u := range ups {
		dials[i] = u.Dial
	}
	return dials
}
