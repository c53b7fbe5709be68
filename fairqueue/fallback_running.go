package fairqueue

import (
	"maps"
	"strings"
	"sync"
)

// storeRunning is what a fallback queue counts of the node's requests
// that the store granted and that still ran when the fallback queue
// opened (the outage began): they run on, unknown to the fallback
// queue's store, and take from the node's part of the capacity, on
// their upstreams, with their tokens and for their tenants
// (max_in_flight_per_tenant), until they end (Queue.forget).
// The other nodes' requests running then are unknown to the node, and
// count in none of its queues.
type storeRunning struct {
	mu       sync.Mutex
	reqs     map[string]runningReq // by ticket
	n        int                   // len(reqs)
	tokens   int                   // their tokens
	on       map[string]int        // permits by upstream ("": none named, may run on any)
	tokensOn map[string]int        // tokens by upstream, likewise
	tenants  map[string]int        // permits by tenant, of fair tickets (Limits.TenantsOutside)
}

// runningReq is a request of storeRunning.
type runningReq struct {
	upstream string
	tokens   int
	tenant   string // of a fair ticket; "" otherwise
}

// newStoreRunning counts the node's tickets that hold a permit of the
// store (none of a fallback queue, nor admitted by fail-open): nil when
// there are none.
func (q *Queue) newStoreRunning() *storeRunning {
	q.mu.Lock()
	defer q.mu.Unlock()
	var s *storeRunning
	for id, t := range q.tickets {
		if t.failOpen || t.state.Load() != stateGranted {
			continue
		}
		if s == nil {
			s = &storeRunning{reqs: map[string]runningReq{}, on: map[string]int{}, tokensOn: map[string]int{},
				tenants: map[string]int{}}
		}
		r := runningReq{upstream: upstreamOf(t), tokens: t.tokens, tenant: flowTenant(TicketFlow(id))}
		s.reqs[id] = r
		s.n++
		s.tokens += r.tokens
		s.on[r.upstream]++
		s.tokensOn[r.upstream] += r.tokens
		if r.tenant != "" {
			s.tenants[r.tenant]++
		}
	}
	return s
}

// flowTenant is the tenant of a fair ticket's flow (TicketFlow): the
// flow less its priority band; "" for none.
func flowTenant(flow string) string {
	if i := strings.LastIndexByte(flow, '.'); i >= 0 {
		return flow[:i]
	}
	return flow
}

// end takes ticket id's request out, if counted: it ended. It reports
// whether it was.
func (s *storeRunning) end(id string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	r, ok := s.reqs[id]
	if !ok {
		return false
	}
	delete(s.reqs, id)
	s.n--
	s.tokens -= r.tokens
	s.on[r.upstream]--
	s.tokensOn[r.upstream] -= r.tokens
	if r.tenant != "" {
		if s.tenants[r.tenant]--; s.tenants[r.tenant] <= 0 {
			delete(s.tenants, r.tenant)
		}
	}
	return true
}

// endRunning takes ticket id's request out of those the fallback queue
// counts, if it was, and then has the fallback queue hand the permit on
// at once (its waiters are granted by its poll's reconcile, under the
// limits less those still running): the store's release, which would
// have, goes to a store that is down, and the fallback store hears of
// no release. Without it the permit idled until the next poll, up to
// poll_interval.
func (q *Queue) endRunning(id string) {
	r := q.running.Load()
	if r == nil || !r.end(id) {
		return
	}
	q.localMu.Lock()
	l := q.local
	q.localMu.Unlock()
	if l != nil {
		l.s.wake()
	}
}

// less is l less the requests still running: the permits (at least 0),
// the tokens (lessTokens), each upstream's permits and tokens less
// those running on it and those that may run on any, and, under a
// tenant cap, each tenant's permits held (Limits.TenantsOutside).
func (s *storeRunning) less(l Limits) Limits {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.n == 0 {
		return l
	}
	if l.MaxInFlightPerTenant > 0 && len(s.tenants) > 0 {
		l.TenantsOutside = maps.Clone(s.tenants)
	}
	l.Permits = max(l.Permits-s.n, 0)
	l.Tokens = lessTokens(l.Tokens, s.tokens)
	if len(l.Upstreams) > 0 {
		ups := make([]Upstream, len(l.Upstreams))
		for i, u := range l.Upstreams {
			u.Permits = max(u.Permits-s.on[u.Dial]-s.on[""], 0)
			u.KVTokens = lessTokens(u.KVTokens, s.tokensOn[u.Dial]+s.tokensOn[""])
			ups[i] = u
		}
		l.Upstreams = ups
	}
	return l
}
