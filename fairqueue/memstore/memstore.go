// Package memstore is the in-process implementation of fairqueue.Store,
// for a queue local to one process (one Caddy instance, no Redis). It has
// the semantics of the Redis store: FIFO by arrival or fair queueing by
// usage counters (fair.go), leases, node liveness, tombstones, idempotent
// calls; grants are handed over by a function call instead of a Pub/Sub
// message.
package memstore

import (
	"container/heap"
	"context"
	"sync"
	"time"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
)

// Store is one in-process queue. Several Queues (nodes) may share one
// Store, as several processes share one Redis queue. The zero value is
// not usable; call New.
type Store struct {
	mu        sync.Mutex
	now       func() time.Time
	seq       int64
	grants    int64
	epoch     string
	waiting   waitHeap             // FIFO tickets waiting (fair ones wait in their flow)
	index     map[string]*waiter   // every waiting ticket by ID
	holders   map[string]time.Time // ticket -> lease expiry
	nodes     map[string]time.Time // node -> liveness expiry
	members   map[string]member    // node -> its lease and join mark
	pools     map[string][]string  // node -> its pool's upstreams, as its last heartbeat named them
	listeners map[string]fairqueue.Listener
	gone      map[string]time.Time // tombstones -> expiry
	expired   int64                // permits freed by an ended lease
	fairState
	poolState
	tokenState
	adaptState
}

// New returns an empty Store.
func New() *Store {
	return &Store{
		now:       time.Now,
		epoch:     "local",
		index:     make(map[string]*waiter),
		holders:   make(map[string]time.Time),
		nodes:     make(map[string]time.Time),
		members:   make(map[string]member),
		pools:     make(map[string][]string),
		listeners: make(map[string]fairqueue.Listener),
		gone:      make(map[string]time.Time),

		fairState:  newFairState(),
		poolState:  newPoolState(),
		tokenState: newTokenState(),
	}
}

// member is what the store knows of a node besides its liveness: its own
// lease (grants to its waiters, by any node, expire after it) and mark,
// the heartbeat that last found it forgotten (0: an acquire brought it
// back; its next heartbeat reports it rejoined).
type member struct {
	lease time.Duration
	mark  uint64
}

// leaseOf is node's own lease, or def when the store does not know it.
func (s *Store) leaseOf(node string, def time.Duration) time.Duration {
	if m, ok := s.members[node]; ok {
		return m.lease
	}
	return def
}

type waiter struct {
	id     string
	seq    int64
	cost   float64 // TicketArgs.Cost (fair)
	tokens int     // TicketArgs.Tokens
	asks   int     // TicketArgs.Asks
	flow   *flow   // nil: a FIFO ticket
	i      int
}

// waitHeap orders waiters by arrival.
type waitHeap []*waiter

func (h waitHeap) Len() int           { return len(h) }
func (h waitHeap) Less(i, j int) bool { return h[i].seq < h[j].seq }
func (h waitHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i]; h[i].i = i; h[j].i = j }
func (h *waitHeap) Push(x any)        { w := x.(*waiter); w.i = len(*h); *h = append(*h, w) }
func (h *waitHeap) Pop() any {
	old := *h
	w := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	return w
}

// pending collects grants made under the lock, delivered after it.
type pending map[fairqueue.Listener][]fairqueue.Grant

func (p pending) deliver() {
	for h, gs := range p {
		h.Granted(gs...)
	}
}

// join makes node alive, with its lease, marked so that its next
// heartbeat reports it rejoined, and records its pool (dialsOf): the
// acquire or requeue that brings a node back.
func (s *Store) join(node string, lease time.Duration, ups []fairqueue.Upstream, now time.Time) {
	s.nodes[node] = now.Add(lease)
	s.members[node] = member{lease: lease}
	s.pools[node] = dialsOf(ups)
}

func (s *Store) alive(node string, now time.Time) bool {
	exp, ok := s.nodes[node]
	return ok && !exp.Before(now)
}

// reapAndDispatch frees expired leases and, while permits are free (and
// an upstream of the pool is eligible, pool.go), grants the FIFO head or
// the head of the next ready flow, whichever arrived first (both kinds
// wait only while a reload toggles Fair), dropping waiters of dead nodes.
func (s *Store) reapAndDispatch(self string, l fairqueue.Limits, now time.Time, out pending) {
	s.inCap, s.outside = l.MaxInFlightPerTenant, l.TenantsOutside
	for id, exp := range s.holders {
		if !exp.After(now) {
			s.unhold(id, 0)
			s.expired++
		}
	}
	s.pruneCooling(now)
	for len(s.holders) < l.Permits {
		w, up, passed := s.candidate(l, now, self)
		if w == nil {
			break
		}
		s.unqueue(w)
		node := fairqueue.TicketNode(w.id)
		if !s.alive(node, now) {
			if w.flow != nil {
				s.settle(w.flow)
			}
			continue
		}
		if passed {
			s.passes++
		} else {
			s.passes = 0
		}
		_, held := s.holders[w.id]
		s.holders[w.id] = now.Add(s.leaseOf(node, l.Lease))
		if w.flow != nil {
			s.charge(w.flow, w.cost, held)
		}
		s.grants++
		if s.bare(node, self) {
			// Its request runs on its route's static upstream, not on up;
			// granted on none (with room on every one: pickWaiter), it
			// counts on every upstream.
			up = ""
		}
		if on, ok := s.holderOn[w.id]; ok {
			up = on // adopted while it waited: it runs there
		}
		s.granted(w.id, up, s.grants)
		s.countTokens(l, w.id, w.weight(l), up)
		if h := s.listeners[node]; h != nil {
			out[h] = append(out[h], fairqueue.Grant{Ticket: w.id, No: s.grants, At: now, Upstream: up, Permits: l.Permits})
		}
	}
}

// Open implements fairqueue.Store.
func (s *Store) Open(_ context.Context, node string, h fairqueue.Listener) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.listeners[node] = h
	return nil
}

// Acquire implements fairqueue.Store.
func (s *Store) Acquire(_ context.Context, t fairqueue.TicketArgs) (fairqueue.AcquireResult, error) {
	out := pending{}
	defer out.deliver()
	s.mu.Lock()
	defer s.mu.Unlock()
	t.Limits = s.scaled(t.Limits)
	now := s.now()
	res := fairqueue.AcquireResult{Epoch: s.epoch}
	if s.tombstoned(t.ID, now) || s.left(t.Node, now) {
		res.Gone = true
		return res, nil
	}
	if !s.alive(t.Node, now) {
		// Brought back: its next heartbeat reports it rejoined, since
		// its waiters may have been dropped while it was not alive.
		s.join(t.Node, t.Lease, t.Limits.Upstreams, now)
	}
	res.Grants = s.grants
	if _, ok := s.holders[t.ID]; ok {
		res.Granted, res.Upstream = true, s.holderOn[t.ID]
		return res, nil
	}
	inCap := t.MaxInFlightPerTenant
	if w, ok := s.index[t.ID]; ok {
		res.Position = s.position(w, inCap)
		return res, nil
	}
	s.reapAndDispatch(t.Node, t.Limits, now, out)
	name := fairqueue.TicketFlow(t.ID)
	weight := asked(t.Limits, t.Tokens, t.Asks)
	up, eligible := s.pickFor(t.Limits, now, weight)
	free := eligible && len(s.holders) < t.Permits && s.waiting.Len() == 0 && s.next(inCap) == nil
	var f *flow
	if name != "" {
		f = s.flows[name]
		free = free && (inCap <= 0 || s.tenantHeld(flowTenant(name)) < inCap)
	}
	if !free && ((t.MaxQueue > 0 && len(s.index) >= t.MaxQueue) ||
		(f != nil && t.MaxQueuePerTenant > 0 && f.q.Len() >= t.MaxQueuePerTenant)) {
		res.Full, res.Position = true, len(s.index)+1
		return res, nil
	}
	s.seq++
	res.Seq = s.seq
	if free {
		s.holders[t.ID] = now.Add(t.Lease)
		if name != "" {
			s.charge(s.arrive(name, inCap), t.Cost, false)
		}
		s.grants++
		s.granted(t.ID, up, s.grants)
		s.countTokens(t.Limits, t.ID, weight, up) // a waiter queued again keeps its weight
		res.Granted, res.GrantNo, res.Grants, res.Upstream = true, s.grants, s.grants, up
		return res, nil
	}
	w := &waiter{id: t.ID, seq: s.seq, cost: t.Cost, tokens: t.Tokens, asks: t.Asks}
	res.Grants = s.grants
	if name != "" {
		res.Position = s.enqueue(w, name, inCap)
		return res, nil
	}
	heap.Push(&s.waiting, w)
	s.index[t.ID] = w
	res.Position = len(s.index) // every other waiter arrived before it
	return res, nil
}

// position is the number of waiters ahead of w plus one: a FIFO waiter
// counts those that arrived before it (O(1) for the newest), a fair one
// estimates it (fairPosition).
func (s *Store) position(w *waiter, inCap int) int {
	if w.flow != nil {
		return s.fairPosition(w, inCap)
	}
	if w.seq == s.seq {
		return len(s.index)
	}
	n := 1
	for _, o := range s.index {
		if o.seq < w.seq {
			n++
		}
	}
	return n
}

// Release implements fairqueue.Store.
func (s *Store) Release(_ context.Context, t fairqueue.TicketArgs) error {
	out := pending{}
	defer out.deliver()
	s.mu.Lock()
	defer s.mu.Unlock()
	t.Limits = s.scaled(t.Limits)
	now := s.now()
	s.markFreed(t.ID, t.Tombstone, t.Lease, now)
	shared := s.fairWaits() || len(s.holderOn) > 0
	// It cools, unless id held nothing and it cools already (pool.go).
	s.cool(t.Cool, t.CoolFor, !s.release(t.ID, t.Correction), now)
	s.reapAndDispatch(t.Node, t.Limits, now, out)
	s.noteHeads(t.ID, t.Limits, shared, now)
	return nil
}

// markFreed marks ticket id given back for lease when mark is set
// (fairqueue.TicketArgs.Tombstone): a heartbeat of its node sent before
// the release does not count it again.
func (s *Store) markFreed(id string, mark bool, lease time.Duration, now time.Time) {
	if mark {
		s.gone[id] = now.Add(lease)
	}
}

// freed reports whether ticket id was given back with a mark that lives.
func (s *Store) freed(id string, now time.Time) bool {
	exp, ok := s.gone[id]
	return ok && exp.After(now)
}

// Cancel implements fairqueue.Store.
func (s *Store) Cancel(_ context.Context, t fairqueue.TicketArgs) error {
	out := pending{}
	defer out.deliver()
	s.mu.Lock()
	defer s.mu.Unlock()
	t.Limits = s.scaled(t.Limits)
	now := s.now()
	if t.Tombstone {
		s.gone[t.ID] = now.Add(time.Minute)
	}
	if w, ok := s.index[t.ID]; ok {
		s.unqueue(w)
		if w.flow != nil {
			s.settle(w.flow)
		}
	}
	s.unhold(t.ID, t.Correction) // granted meanwhile: a grant nobody used
	s.reapAndDispatch(t.Node, t.Limits, now, out)
	return nil
}

// Heartbeat implements fairqueue.Store. An in-process store never loses
// its data: a held ticket it does not have was released while the
// heartbeat was on its way. Such a release is marked (TicketArgs.Tombstone)
// and the ticket not counted again; one that is not (the node thought
// no heartbeat on its way) is re-added and reported, as by every store,
// and the node releases it again. A node that was forgotten (not
// alive, or brought back by an acquire since its last heartbeat)
// re-adds nothing in that heartbeat (it may have left); one that left
// (Leave) changes nothing, adopts nothing (left.go); from its next
// one on it counts again the permits it still holds. Its pending
// tickets that are not here (dropped at the head while it was not
// alive) are reported missing.
func (s *Store) Heartbeat(_ context.Context, hb fairqueue.HeartbeatArgs) (fairqueue.HeartbeatResult, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	hb.Limits = s.scaled(hb.Limits)
	now := s.now()
	if s.left(hb.Node, now) { // late, after its leave: changes nothing
		return fairqueue.HeartbeatResult{Epoch: s.epoch, Rejoined: true, At: now, Cluster: s.view(hb.Node, hb.Limits.Upstreams, now)}, nil
	}
	m, known := s.members[hb.Node]
	if !known || m.mark == 0 || !s.alive(hb.Node, now) {
		m.mark = hb.Beat
	}
	rejoined := m.mark == hb.Beat
	m.lease = hb.Lease
	s.members[hb.Node] = m
	res := fairqueue.HeartbeatResult{Epoch: s.epoch, Rejoined: rejoined, At: now}
	s.nodes[hb.Node] = now.Add(hb.Lease)
	s.poolOf(hb.Node, hb.Limits.Upstreams)
	// A holder counts the weight its node names, whatever hb.Limits
	// count (a reload turned kv_tokens off while its request ran): as a
	// grant counts a waiter's, and one counted already without a weight
	// gets it (in Redis, a local handoff to a waiter it had lost).
	for _, id := range hb.Held {
		if _, ok := s.holders[id]; ok {
			s.holders[id] = now.Add(hb.Lease)
			if !rejoined {
				s.countTokens(hb.Limits, id, hb.Tokens[id], s.holderOn[id])
			}
		} else if !rejoined && !s.freed(id, now) {
			s.leaveQueue(id)
			s.holders[id] = now.Add(hb.Lease)
			s.heldAgain(id)
			s.holdOn(id, hb.Upstreams[id])
			s.countTokens(hb.Limits, id, hb.Tokens[id], hb.Upstreams[id])
			res.Readded = append(res.Readded, id)
		}
	}
	for _, id := range hb.Pending {
		_, held := s.holders[id]
		if _, queued := s.index[id]; !queued && !held {
			res.Missing = append(res.Missing, id)
		}
	}
	for _, id := range hb.Adopt {
		if s.freed(id, now) {
			continue
		}
		if _, ok := s.holders[id]; !ok {
			s.leaveQueue(id)
			s.heldAgain(id)
			s.holdOn(id, hb.Upstreams[id])
			s.countTokens(hb.Limits, id, hb.Tokens[id], hb.Upstreams[id])
		}
		s.holders[id] = now.Add(hb.Lease)
	}
	res.Cluster = s.view(hb.Node, hb.Limits.Upstreams, now)
	for id, exp := range s.gone {
		if !exp.After(now) {
			delete(s.gone, id)
		}
	}
	return res, nil
}

// leaveQueue takes id out of the queue where a heartbeat counts it as a
// holder (adopted, or re-added, while still queued): its request runs,
// once; left queued it would count in every position and be granted
// again, after it ended (as in heartbeat.lua).
func (s *Store) leaveQueue(id string) {
	if w, ok := s.index[id]; ok {
		s.unqueue(w)
		if w.flow != nil {
			s.settle(w.flow)
		}
	}
}

// Reconcile implements fairqueue.Store.
func (s *Store) Reconcile(_ context.Context, node string, l fairqueue.Limits) (fairqueue.ReconcileResult, error) {
	out := pending{}
	defer out.deliver()
	s.mu.Lock()
	defer s.mu.Unlock()
	l = s.scaled(l)
	now := s.now()
	s.reapAndDispatch(node, l, now, out)
	s.pruneIdle()
	s.forgetDead(now)
	res := fairqueue.ReconcileResult{Epoch: s.epoch, Grants: s.grants, Waiting: len(s.index), Upstreams: s.upstreamsOf(node)}
	for id := range s.holders {
		if fairqueue.TicketNode(id) == node {
			res.Holders = append(res.Holders, id)
		}
	}
	return res, nil
}

// Leave implements fairqueue.Store.
func (s *Store) Leave(_ context.Context, node string, l fairqueue.Limits) error {
	out := pending{}
	defer out.deliver()
	s.mu.Lock()
	defer s.mu.Unlock()
	l = s.scaled(l)
	for id := range s.holders {
		if fairqueue.TicketNode(id) == node {
			s.unhold(id, 0)
		}
	}
	delete(s.nodes, node)
	delete(s.members, node)
	delete(s.pools, node)
	delete(s.listeners, node)
	now := s.now()
	s.markLeft(node, now)
	s.reapAndDispatch("", l, now, out) // as leave.lua: its waiters are gone
	s.pruneIdle()
	s.forgetDead(now)
	s.forgetIfEmpty()
	return nil
}

// forgetDead forgets the nodes whose liveness ended, and takes their
// waiters out of the queue: nothing cancels a crashed node's waiters,
// and they would count against MaxQueue and in every position until
// dispatch reached them. A node only partitioned names them in the
// heartbeat that reports it rejoined, and queues them again.
func (s *Store) forgetDead(now time.Time) {
	var dead map[string]bool
	for n, exp := range s.nodes {
		if exp.Before(now) {
			delete(s.nodes, n)
			delete(s.members, n)
			delete(s.pools, n)
			if dead == nil {
				dead = make(map[string]bool)
			}
			dead[n] = true
		}
	}
	if dead == nil {
		return
	}
	for _, w := range s.index {
		if dead[fairqueue.TicketNode(w.id)] {
			s.unqueue(w)
			if w.flow != nil {
				s.settle(w.flow)
			}
		}
	}
}

// Close implements fairqueue.Store. The Store stays usable by other nodes.
func (s *Store) Close() error { return nil }

var (
	_ fairqueue.Store     = (*Store)(nil)
	_ fairqueue.Inspector = (*Store)(nil)
)
