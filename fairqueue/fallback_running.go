package fairqueue

import (
	"maps"
	"strings"
	"sync"
	"time"
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
	tokens   int                   // their tokens
	on       map[string]int        // permits by upstream ("": none named, may run on any)
	tokensOn map[string]int        // tokens by upstream, likewise
	tenants  map[string]int        // permits by tenant, of fair tickets (Limits.TenantsOutside)
	cooling  map[string]time.Time  // upstream -> the end of its cooldown (Queue.coolLocal)
	hold     *exitTurn             // no permit until its line passed its number (Queue.holdLocal)
}

// runningReq is a request of storeRunning.
type runningReq struct {
	upstream string
	tokens   int
	tenant   string // of a fair ticket; "" otherwise
}

// newStoreRunning counts the node's tickets that hold a permit of the
// store, or were let in by fail open (a reload set local during the
// outage: they run on the same upstreams, unknown to the fallback
// queue's store), but none of a fallback queue's (its store counts
// them, also once it retired), and makes
// the count the node's (Queue.running) before a ticket can leave: one
// that ends once counted is taken out of it (Queue.forget). It starts
// with the node's cooldowns not yet over (cooledLocal) and the hold of
// the last move of the store's waiters (holdLocal). Each weighs its
// tokens as the store may have counted them under cfg (heldWeight).
// With q.localMu held.
func (q *Queue) newStoreRunning(cfg *Config) *storeRunning {
	q.mu.Lock()
	defer q.mu.Unlock()
	s := &storeRunning{reqs: map[string]runningReq{}, on: map[string]int{}, tokensOn: map[string]int{},
		tenants: map[string]int{}, cooling: q.cooledLocal(), hold: q.entering}
	for id, t := range q.tickets {
		if t.local || t.state.Load() != stateGranted {
			continue
		}
		s.add(id, runningReq{upstream: upstreamOf(t), tokens: heldWeight(cfg, t), tenant: flowTenant(TicketFlow(id))})
	}
	q.running.Store(s)
	return s
}

// reloadLocal gives the fallback queue in use, if any, the settings in
// force (a reload; old: the settings it replaced), having it count first
// the requests fail open let in while old had none (countFailOpen).
// Also where they keep none (fail_open, fail_closed): it serves on, its
// waiters while the store is down, and the node's requests once the
// store is back until the heartbeat that has the store count its permits
// (unavailable), and under the settings of before it ran a tenant above
// the reload's cap, or the upstreams above its permits; there, no more
// permits (or tokens) than it had: the reload's share of the capacity is
// the node's under local, and the local_permits it drops was the
// operator's bound on the fallback queue. With q.localMu held.
func (q *Queue) reloadLocal(old *Config) {
	in := q.cfg.Load()
	if old.Fallback == nil && in.Fallback != nil {
		q.countFailOpen(in)
	}
	lc, _ := q.localConfig(in)
	if in.Fallback == nil && q.local != nil {
		lc = noMoreThan(lc, q.local.Config())
	}
	q.reconfigureLocal(lc)
}

// noMoreThan is the fallback queue's config lc with no more permits or
// tokens than cur has, in all and on each of cur's upstreams.
func noMoreThan(lc, cur Config) Config {
	lc.Permits = min(lc.Permits, cur.Permits)
	lc.KVTokens = lessOf(lc.KVTokens, cur.KVTokens)
	if len(lc.Upstreams) == 0 {
		return lc
	}
	ups := make([]Upstream, len(lc.Upstreams))
	for i, u := range lc.Upstreams {
		for _, c := range cur.Upstreams {
			if c.Dial == u.Dial {
				u.Permits = min(u.Permits, c.Permits)
				u.KVTokens = lessOf(u.KVTokens, c.KVTokens)
			}
		}
		ups[i] = u
	}
	lc.Upstreams = ups
	return lc
}

// lessOf is the lesser of two token bounds (0: none).
func lessOf(a, b int) int {
	if a <= 0 || b <= 0 {
		return a
	}
	return min(a, b)
}

// countFailOpen has the fallback queue in use, if any, count the
// requests fail open let in that still run and that it does not count
// yet: a reload set local (cfg) while it was open, after one that set
// fail_open during the outage. They run on the same upstreams, as those
// it counted as it opened (newStoreRunning); uncounted, it granted its
// local permits beside them. With q.localMu held, as localQueue opens
// the fallback queue.
func (q *Queue) countFailOpen(cfg *Config) {
	s := q.running.Load()
	if q.local == nil || s == nil {
		return
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	s.mu.Lock()
	defer s.mu.Unlock()
	for id, t := range q.tickets {
		if _, counted := s.reqs[id]; counted || !t.failOpen || t.local || t.state.Load() != stateGranted {
			continue
		}
		s.add(id, runningReq{upstream: upstreamOf(t), tokens: heldWeight(cfg, t), tenant: flowTenant(TicketFlow(id))})
	}
}

// add counts ticket id's request r (with s.mu held, or s not yet the
// node's).
func (s *storeRunning) add(id string, r runningReq) {
	s.reqs[id] = r
	s.tokens += r.tokens
	s.on[r.upstream]++
	s.tokensOn[r.upstream] += r.tokens
	if r.tenant != "" {
		s.tenants[r.tenant]++
	}
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
	q.wakeLocal()
}

// wakeLocal has the fallback queue in use, if any, reconcile at once: a
// permit it may give is free.
func (q *Queue) wakeLocal() {
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
// tenant cap, each tenant's permits held (Limits.TenantsOutside). An
// upstream cooling (coolLocal) has no permit until its cooldown ends, and
// none has under a hold (Queue.holdLocal).
func (s *storeRunning) less(l Limits) Limits {
	s.mu.Lock()
	defer s.mu.Unlock()
	l = s.lessRunning(l)
	if s.holding() {
		return held(l)
	}
	return l
}

// lessRunning is less but for the hold (with s.mu held).
func (s *storeRunning) lessRunning(l Limits) Limits {
	now := time.Now()
	maps.DeleteFunc(s.cooling, func(_ string, end time.Time) bool { return !now.Before(end) })
	if len(s.reqs) == 0 && len(s.cooling) == 0 {
		return l
	}
	if l.MaxInFlightPerTenant > 0 && len(s.tenants) > 0 {
		l.TenantsOutside = maps.Clone(s.tenants)
	}
	l.Permits = max(l.Permits-len(s.reqs), 0)
	l.Tokens = lessTokens(l.Tokens, s.tokens)
	if len(l.Upstreams) > 0 {
		ups := make([]Upstream, len(l.Upstreams))
		for i, u := range l.Upstreams {
			u.Permits = max(u.Permits-s.on[u.Dial]-s.on[""], 0)
			u.KVTokens = lessTokens(u.KVTokens, s.tokensOn[u.Dial]+s.tokensOn[""])
			if _, cooling := s.cooling[u.Dial]; cooling {
				u.Permits = 0 // out of dispatch until its cooldown ends
			}
			ups[i] = u
		}
		l.Upstreams = ups
	}
	return l
}

// coolLocal leaves upstream up out of the fallback queue's dispatch for
// d (cfg's Fallback; opened now if it is not yet: the request whose
// upstream refused it waits there next). That request's permit is the
// store's (Permit.requeue while the store is down, or after its requeue
// call failed): its cooldown went to the store, which cannot take it,
// and the fallback queue's store cools an upstream only at the release
// of a permit of its own. Without it, the request was granted again on
// the upstream that had just refused it. The node keeps the cooldown
// too (localCool): the fallback queue of a later outage within it opens
// with it (cooledLocal). The fallback queue reconciles as the cooldown
// ends (its waiters are granted then, not at its next poll). failed: the
// request's store call failed (localQueue). The policy is the one in
// force now, not one read before the request's call to the store: a
// reload that set on_store_error local while the call was on its way
// sends the request to the fallback queue, and its cooldown goes there
// too (read before, the request was granted again at once on the
// upstream that had just refused it). So does a policy without a
// fallback queue while the one opened before a reload still serves
// (inFallback: the store back, the heartbeat that counts its permits
// not yet run): the request waits there (unavailable), and was granted
// again at once on the upstream that had just refused it.
func (q *Queue) coolLocal(up string, d time.Duration, failed bool) {
	if up == "" {
		return
	}
	end := q.noteCool(up, d) // fail_open's picks leave it out too (localUpstream)
	if q.cfg.Load().Fallback == nil && !q.inFallback() {
		return
	}
	l := q.localQueue(failed)
	if r := q.running.Load(); r != nil {
		r.mu.Lock()
		if end.After(r.cooling[up]) {
			r.cooling[up] = end
		}
		r.mu.Unlock()
	}
	if l != nil {
		// Its permits there are handed on as the cooldown ends, not at
		// the fallback queue's next poll (cooldown_end.go).
		l.s.cooled(d)
	}
}

// noteCool keeps, in the node, that upstream up cools for d from now
// (localCool), and returns the cooldown's end: for the fallback queues
// opened within it (cooledLocal) and the upstreams a fail-open permit
// is sent to (localUpstream). The cooldowns over are dropped.
func (q *Queue) noteCool(up string, d time.Duration) time.Time {
	now := time.Now()
	end := now.Add(d)
	q.localMu.Lock()
	defer q.localMu.Unlock()
	if q.localCool == nil {
		q.localCool = map[string]time.Time{}
	}
	maps.DeleteFunc(q.localCool, func(_ string, end time.Time) bool { return !now.Before(end) })
	if end.After(q.localCool[up]) {
		q.localCool[up] = end
	}
	return end
}

// cooledLocal is the cooldowns of coolLocal not yet over, for a new
// fallback queue (with q.localMu held). Kept by the fallback queue alone,
// they ended with it: Redis, back for a moment, then gone again within
// the cooldown, the next fallback queue granted the upstream that had
// refused at once. The fallback store has the cooldowns of its own
// permits.
func (q *Queue) cooledLocal() map[string]time.Time {
	now := time.Now()
	maps.DeleteFunc(q.localCool, func(_ string, end time.Time) bool { return !now.Before(end) })
	cooling := make(map[string]time.Time, len(q.localCool))
	maps.Copy(cooling, q.localCool)
	return cooling
}
