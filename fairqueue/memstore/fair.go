package memstore

import (
	"cmp"
	"container/heap"
	"math"
	"slices"
	"strings"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
)

// Fair queueing by usage counters (VTC: Sheng et al., "Fairness in
// Serving LLMs", OSDI 2024), the rules the Redis store's Lua scripts
// follow too:
//
//   - Every active flow (one with waiters or permits held) has a usage
//     counter; a grant first raises the virtual time V to the flow's
//     counter, if higher, then adds the ticket's Cost to the counter.
//   - A flow is ready when it has waiters and its tenant holds fewer
//     than MaxInFlightPerTenant permits (or there is no cap). Dispatch
//     serves the ready flow with the least counter, ties by the arrival
//     of its head ticket; each flow is served in arrival order.
//   - A flow that becomes active starts at the least counter of the
//     ready flows (V when none is ready), or at the counter it left with
//     if that is higher (kept while above V): leaving and coming back
//     does not clear a debt, and idling earns no credit.
//   - A release adds the ticket's Correction to the counter.
//   - When V passes rebaseAt, every counter is moved down by V.

// rebaseAt is the virtual time beyond which counters are rebased to
// keep them far from float64's loss of precision.
const rebaseAt = 1e9

// fairState is the store's fair queueing state; guarded by Store.mu.
type fairState struct {
	flows    map[string]*flow   // active flows
	idle     map[string]float64 // counter of an idle flow that left above vtime
	tenantIn map[string]int     // tenant -> permits its fair tickets hold
	vtime    float64            // V: the largest counter charged at a grant
	// outside is Limits.TenantsOutside of the last call: permits the
	// cap counts besides tenantIn.
	outside map[string]int
	// inCap is MaxInFlightPerTenant of the last call, for State and
	// Inspect, which carry no Limits.
	inCap int
}

func newFairState() fairState {
	return fairState{flows: make(map[string]*flow), idle: make(map[string]float64), tenantIn: make(map[string]int)}
}

// flow is one active flow: a tenant in one priority band.
type flow struct {
	name, tenant string
	counter      float64
	inflight     int      // permits its tickets hold
	q            waitHeap // its waiting tickets, by seq
}

// flowTenant is the tenant of a flow "<tenant>.<band>".
func flowTenant(name string) string {
	if i := strings.LastIndexByte(name, '.'); i >= 0 {
		return name[:i]
	}
	return name
}

// ready reports whether dispatch may serve f under the tenant cap.
func (s *Store) ready(f *flow, inCap int) bool {
	return f.q.Len() > 0 && (inCap <= 0 || s.tenantHeld(f.tenant) < inCap)
}

// tenantHeld is the permits tenant holds: its fair tickets' here, and
// those the last call counted outside (Limits.TenantsOutside).
func (s *Store) tenantHeld(tenant string) int {
	return s.tenantIn[tenant] + s.outside[tenant]
}

// ahead orders flows for service: the least counter first, ties by the
// arrival of their head tickets. Both have waiters.
func ahead(a, b *flow) bool {
	if a.counter != b.counter {
		return a.counter < b.counter
	}
	return a.q[0].seq < b.q[0].seq
}

// next is the ready flow to serve, nil when none is ready.
func (s *Store) next(inCap int) *flow {
	var best *flow
	for _, f := range s.flows {
		if s.ready(f, inCap) && (best == nil || ahead(f, best)) {
			best = f
		}
	}
	return best
}

// readyFlows are the flows with waiters in service order: the ready
// ones, then (only) the others.
func (s *Store) readyFlows(inCap int) (ready, others []*flow) {
	for _, f := range s.flows {
		if s.ready(f, inCap) {
			ready = append(ready, f)
		} else if f.q.Len() > 0 {
			others = append(others, f)
		}
	}
	order := func(a, b *flow) int {
		if ahead(a, b) {
			return -1
		}
		return 1 // never equal: head seqs differ
	}
	slices.SortFunc(ready, order)
	slices.SortFunc(others, order)
	return ready, others
}

// activate returns flow name, making it active at counter max(its idle
// counter, floor) if it is not.
func (s *Store) activate(name string, floor float64) *flow {
	if f := s.flows[name]; f != nil {
		return f
	}
	c := floor
	if v, ok := s.idle[name]; ok {
		c = max(v, floor)
		delete(s.idle, name)
	}
	f := &flow{name: name, tenant: flowTenant(name), counter: c}
	s.flows[name] = f
	return f
}

// arrive returns the flow of a new fair ticket: an inactive flow starts
// at the least counter of the ready flows, or V when none is ready.
func (s *Store) arrive(name string, inCap int) *flow {
	if f := s.flows[name]; f != nil {
		return f
	}
	floor := s.vtime
	if f := s.next(inCap); f != nil {
		floor = f.counter
	}
	return s.activate(name, floor)
}

// settle makes f idle when it has neither waiters nor permits: its
// counter is kept only when above V.
func (s *Store) settle(f *flow) {
	if f.q.Len() > 0 || f.inflight > 0 || s.flows[f.name] != f {
		return
	}
	if f.counter > s.vtime {
		s.idle[f.name] = f.counter
		if len(s.idle) > fairqueue.IdleFlows {
			s.forgetIdle()
		}
	}
	delete(s.flows, f.name)
}

// forgetIdle keeps the fairqueue.IdleFlows idle counters furthest above
// V, less an eighth (so that it runs once per that many settles); of
// equal counters, those of the names first in order go first, as in
// Redis' sorted set.
func (s *Store) forgetIdle() {
	type entry struct {
		name    string
		counter float64
	}
	es := make([]entry, 0, len(s.idle))
	for n, c := range s.idle {
		es = append(es, entry{n, c})
	}
	slices.SortFunc(es, func(a, b entry) int {
		if a.counter != b.counter {
			return cmp.Compare(a.counter, b.counter)
		}
		return strings.Compare(a.name, b.name)
	})
	for _, e := range es[:len(es)-(fairqueue.IdleFlows-fairqueue.IdleFlows/8)] {
		delete(s.idle, e.name)
	}
}

// charge accounts a grant to f: V catches up with its counter, the
// counter grows by cost, and f holds one more permit unless the ticket
// held one already (adopted while it waited).
func (s *Store) charge(f *flow, cost float64, held bool) {
	s.vtime = max(s.vtime, f.counter)
	if !math.IsNaN(cost) && !math.IsInf(cost, 0) {
		f.counter = advance(f.counter, cost)
	}
	if !held {
		s.hold(f)
	}
	if s.vtime > rebaseAt {
		v := s.vtime
		for _, g := range s.flows {
			g.counter -= v
		}
		for n := range s.idle {
			s.idle[n] -= v
		}
		s.vtime = 0
	}
}

// advance is counter c charged cost: c + cost, or, when a positive cost
// is too small to change c at its magnitude (a long uptime's large
// virtual time), c moved up by one unit of its last place, so that every
// grant still moves its flow behind the others of equal counter. The
// Redis store's charge (lua/fair.lua) computes the same.
func advance(c, cost float64) float64 {
	n := c + cost
	if cost > 0 && n <= c {
		_, exp := math.Frexp(c)
		n = c + math.Ldexp(1, exp-53)
	}
	return n
}

// hold counts one more permit held by f and its tenant.
func (s *Store) hold(f *flow) {
	f.inflight++
	s.tenantIn[f.tenant]++
}

// heldAgain accounts a holder entry created outside a grant (a
// heartbeat re-adding or adopting it): no charge; an inactive flow
// starts at max(its idle counter, V).
func (s *Store) heldAgain(id string) {
	if name := fairqueue.TicketFlow(id); name != "" {
		s.hold(s.activate(name, s.vtime))
	}
}

// unhold ends id's hold, if it holds a permit: its upstream slot is
// freed, its flow's counter takes the correction, and the flow may go
// idle.
func (s *Store) unhold(id string, correction float64) {
	if _, ok := s.holders[id]; !ok {
		return
	}
	delete(s.holders, id)
	s.giveTokens(id, s.holderOn[id])
	s.unholdOn(id)
	f := s.flows[fairqueue.TicketFlow(id)]
	if f == nil || f.inflight == 0 {
		return
	}
	f.inflight--
	if s.tenantIn[f.tenant]--; s.tenantIn[f.tenant] <= 0 {
		delete(s.tenantIn, f.tenant)
	}
	if !math.IsNaN(correction) && !math.IsInf(correction, 0) {
		f.counter += correction
	}
	s.settle(f)
}

// enqueue queues the new fair ticket w in its flow and returns its
// estimated position: its flow gets one grant in every round of the
// ready flows.
func (s *Store) enqueue(w *waiter, name string, inCap int) int {
	f := s.arrive(name, inCap)
	w.flow = f
	heap.Push(&f.q, w)
	s.index[w.id] = w
	return s.fairPosition(w, inCap)
}

// fairPosition estimates the number of waiters ahead of the fair waiter
// w, plus one: min(waiting, aheadInFlow x readyFlows + rankOfFlow + 1).
func (s *Store) fairPosition(w *waiter, inCap int) int {
	f := w.flow
	inFlow := 0
	for _, o := range f.q {
		if o.seq < w.seq {
			inFlow++
		}
	}
	nReady, rank := 1, 0
	for _, o := range s.flows {
		if o != f && s.ready(o, inCap) {
			nReady++
			if ahead(o, f) {
				rank++
			}
		}
	}
	return min(len(s.index), inFlow*nReady+rank+1)
}

// unqueue removes the waiter w from its queue. The caller settles its
// flow (or charges it).
func (s *Store) unqueue(w *waiter) {
	delete(s.index, w.id)
	if w.flow == nil {
		heap.Remove(&s.waiting, w.i)
	} else {
		heap.Remove(&w.flow.q, w.i)
	}
}

// pruneIdle forgets the idle counters V has caught up with.
func (s *Store) pruneIdle() {
	for n, c := range s.idle {
		if c <= s.vtime {
			delete(s.idle, n)
		}
	}
}
