package memstore

import (
	"time"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
)

// Capacity in tokens (Limits.Tokens, Upstream.KVTokens), the rules the
// Redis store's Lua scripts follow too:
//
//   - Every holder carries a weight, its ticket's TicketArgs.Tokens at the
//     grant (TicketArgs.Asks where the grant's limits count tokens: what
//     it asks, unclamped; see asked), bounded by the capacity in force
//     then (Limits.Tokens and,
//     with a pool whose upstreams all set KVTokens, the largest of those;
//     see weigh): a ticket heavier than that runs alone. A grant needs
//     room for its weight besides a free permit: the weights held plus
//     its own at most Limits.Tokens (when counted), and at most its
//     upstream's KVTokens on the upstream it names (a ticket heavier
//     than an upstream's capacity never runs there). Holders granted
//     without an upstream (before a reload added the pool) count on
//     every upstream.
//   - A release (cancel, lease end, leave) returns the weight.
//   - FIFO is strict: a head that does not fit waits and nothing passes
//     it. In fair order, when the flow to serve next has a head that does
//     not fit, a later ready flow whose head fits may be served instead,
//     at most fairqueue.TokenPasses grants in a row; then dispatch waits
//     until the first flow's head fits. The count starts again at every
//     grant that passes nobody. A head of a bare node that cannot be
//     placed (pool.go) is passed the same way, with or without tokens.
//   - The fast path needs room too.

// tokenState is the store's token accounting; guarded by Store.mu.
type tokenState struct {
	weight map[string]int // holder -> its weight (holders that weigh > 0)
	held   int            // the weights of all holders
	onUp   map[string]int // upstream -> the weights of its holders
	// passes counts the grants in a row made past the first flow of the
	// fair order, whose head did not fit.
	passes int
}

func newTokenState() tokenState {
	return tokenState{weight: make(map[string]int), onUp: make(map[string]int)}
}

// bounded is w bounded by a capacity (capacity <= 0: unbounded).
func bounded(w, capacity int) int {
	if capacity > 0 {
		return min(w, capacity)
	}
	return w
}

// asked is what a ticket of weight tokens, asking asks (TicketArgs.Asks),
// weighs before weigh bounds it under l: a call whose limits count tokens
// weighs what it asks, so that a waiter queued clamped to a capacity a
// reload raised since is granted at its full weight at once (its node
// would queue it again weighing that: nothing passes it meanwhile); one
// that counts none keeps the weight its node's config gave it.
func asked(l fairqueue.Limits, tokens, asks int) int {
	if l.Tokens != 0 && asks > tokens {
		return asks
	}
	return tokens
}

// weight is what waiter w weighs in a grant under l (asked).
func (w *waiter) weight(l fairqueue.Limits) int { return asked(l, w.tokens, w.asks) }

// weigh is the weight a ticket of w tokens is counted with under l: w
// bounded by l.TokenBound (the configured capacity: a ticket waits for
// reserved tokens to end rather than count lighter), or without one by
// the queue's capacity and, when every upstream of the pool sets
// KVTokens, by the largest of those (so it fits somewhere alone).
func weigh(l fairqueue.Limits, w int) int {
	if l.TokenBound > 0 {
		return min(max(w, 0), l.TokenBound)
	}
	w = bounded(max(w, 0), l.Tokens)
	m := 0
	for _, u := range l.Upstreams {
		if u.KVTokens <= 0 {
			return w
		}
		m = max(m, u.KVTokens)
	}
	return bounded(w, m)
}

// fitsQueue reports whether w more tokens fit the queue's capacity.
func (s *Store) fitsQueue(l fairqueue.Limits, w int) bool {
	switch {
	case l.Tokens == 0:
		return true
	case l.Tokens < 0:
		return false
	}
	return s.held+weigh(l, w) <= l.Tokens
}

// fitsOn reports whether w more tokens fit upstream u (its KVTokens; the
// weights of holders without an upstream count on every one).
func (s *Store) fitsOn(l fairqueue.Limits, u *fairqueue.Upstream, w int) bool {
	if l.Tokens == 0 || u.KVTokens == 0 {
		return true
	}
	if u.KVTokens < 0 {
		return false
	}
	return s.onUp[u.Dial]+s.anywhereTokens()+weigh(l, w) <= u.KVTokens
}

// anywhereTokens is the weight of holders without an upstream.
func (s *Store) anywhereTokens() int {
	n := s.held
	for _, t := range s.onUp {
		n -= t
	}
	return max(n, 0)
}

// countTokens counts holder id's weight w on upstream dial ("" : none),
// bounded by the capacity in force; a holder counted already is left.
// It counts whatever l counts: a weight is given only by a config that
// counts tokens, and a request granted with it holds those tokens
// wherever it was granted (a reload turned kv_tokens off while it waited
// or ran; in Redis, another node's config during a rolling change).
func (s *Store) countTokens(l fairqueue.Limits, id string, w int, dial string) {
	if _, ok := s.weight[id]; ok || w <= 0 {
		return
	}
	w = weigh(l, w)
	s.weight[id] = w
	s.held += w
	if dial != "" {
		s.onUp[dial] += w
	}
}

// giveTokens returns holder id's weight.
func (s *Store) giveTokens(id, dial string) {
	w, ok := s.weight[id]
	if !ok {
		return
	}
	delete(s.weight, id)
	s.held -= w
	if dial != "" {
		if s.onUp[dial] -= w; s.onUp[dial] <= 0 {
			delete(s.onUp, dial)
		}
	}
}

// candidate is the waiter dispatch serves next and its upstream, or nil:
// the FIFO head or the first ready flow's head, whichever arrived first;
// with tokens, one that fits (see the rules above), or a dead node's,
// which dispatch drops. A first flow's head of a bare node that cannot be
// placed (pickWaiter) is passed as one that does not fit, with or
// without tokens. passed reports that it is served past the first flow.
// self is the dispatching node (pickWaiter).
func (s *Store) candidate(l fairqueue.Limits, now time.Time, self string) (w *waiter, up string, passed bool) {
	first := s.next(l.MaxInFlightPerTenant)
	var fifo *waiter
	if s.waiting.Len() > 0 {
		fifo = s.waiting[0]
	}
	switch {
	case first != nil && (fifo == nil || first.q[0].seq < fifo.seq):
		w = first.q[0]
	case fifo != nil:
		w = fifo
	default:
		return nil, "", false
	}
	up, ok := s.pickWaiter(l, now, self, w)
	if ok || !s.alive(fairqueue.TicketNode(w.id), now) {
		return w, up, false // a dead node's waiter is dropped, whatever it weighs
	}
	if w.flow == nil || s.passes >= fairqueue.TokenPasses || (l.Tokens == 0 && up == "") {
		// Strict FIFO; or the first flow's turn; or, where tokens do not
		// count, no upstream has room: only a waiter of a bare node that
		// cannot be placed (up named, no room on every upstream) is
		// passed then.
		return nil, "", false
	}
	ready, _ := s.readyFlows(l.MaxInFlightPerTenant)
	for _, f := range ready {
		if f == first {
			continue
		}
		if up, ok := s.pickWaiter(l, now, self, f.q[0]); ok {
			return f.q[0], up, true
		}
	}
	return nil, "", false
}
