package memstore

import (
	"cmp"
	"context"
	"slices"
	"strings"
	"time"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
)

// State is a snapshot of the queue, for tests and status pages.
type State struct {
	// Waiting are the waiting tickets: the FIFO ones in arrival order,
	// then the fair ones flow by flow (each in arrival order), the ready
	// flows in the order dispatch would serve them now, then the flows
	// whose tenant is at its MaxInFlightPerTenant cap. Not the grant
	// order of fair tickets, which take turns across flows.
	Waiting []string
	Holders []string
	Nodes   []string
	// Upstreams are the pool upstreams the store keeps state for: with
	// holders, cooling, or granted on since the queue was last empty.
	Upstreams []string
}

// State returns a snapshot of the queue. Readiness under the tenant cap
// is judged by the MaxInFlightPerTenant of the last call that
// dispatched.
func (s *Store) State() State {
	s.mu.Lock()
	defer s.mu.Unlock()
	var st State
	for _, w := range sorted(s.waiting) {
		st.Waiting = append(st.Waiting, w.id)
	}
	ready, others := s.readyFlows(s.inCap)
	for _, f := range append(ready, others...) {
		for _, w := range sorted(f.q) {
			st.Waiting = append(st.Waiting, w.id)
		}
	}
	for id := range s.holders {
		st.Holders = append(st.Holders, id)
	}
	for n := range s.nodes {
		st.Nodes = append(st.Nodes, n)
	}
	for dial := range s.inflight {
		st.Upstreams = append(st.Upstreams, dial)
	}
	for dial := range s.cooling {
		st.Upstreams = append(st.Upstreams, dial)
	}
	for dial := range s.lastNo {
		st.Upstreams = append(st.Upstreams, dial)
	}
	slices.Sort(st.Upstreams)
	st.Upstreams = slices.Compact(st.Upstreams)
	return st
}

// sorted returns h's waiters in arrival order.
func sorted(h waitHeap) []*waiter {
	ws := slices.Clone(h)
	slices.SortFunc(ws, func(a, b *waiter) int { return cmp.Compare(a.seq, b.seq) })
	return ws
}

// Inspect implements fairqueue.Inspector. Head lists the head ticket of
// each ready flow in the order dispatch would serve them, then the FIFO
// waiters in arrival order.
func (s *Store) Inspect(_ context.Context, head, flows int) (fairqueue.Snapshot, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now()
	snap := fairqueue.Snapshot{Waiting: len(s.index), Grants: s.grants, TokensHeld: s.held, LearnedShare: s.shares[""]}
	ready, _ := s.readyFlows(s.inCap)
	for _, f := range ready {
		snap.Head = append(snap.Head, f.q[0].id)
	}
	for _, w := range sorted(s.waiting) {
		snap.Head = append(snap.Head, w.id)
	}
	snap.Head = snap.Head[:min(max(head, 0), len(snap.Head))]
	for id, exp := range s.holders {
		snap.Holders = append(snap.Holders, fairqueue.Holder{Ticket: id, Node: fairqueue.TicketNode(id),
			LeaseLeft: exp.Sub(now), Upstream: s.holderOn[id], Tokens: s.weight[id]})
	}
	snap.Upstreams = fairqueue.WithShares(s.upstreamInfos(now), s.shares)
	for n, exp := range s.nodes {
		snap.Nodes = append(snap.Nodes, fairqueue.NodeInfo{ID: n, Alive: !exp.Before(now), ExpiresIn: exp.Sub(now)})
	}
	for _, f := range s.flows {
		if f.q.Len() > 0 {
			snap.Flows = append(snap.Flows, fairqueue.FlowInfo{Flow: f.name, Waiting: f.q.Len(), Held: f.inflight, Usage: f.counter - s.vtime})
		}
	}
	slices.SortFunc(snap.Flows, func(a, b fairqueue.FlowInfo) int {
		return cmp.Or(b.Waiting-a.Waiting, strings.Compare(a.Flow, b.Flow))
	})
	snap.Flows = snap.Flows[:min(max(flows, 0), len(snap.Flows))]
	return snap, nil
}

// Purge implements fairqueue.Inspector: the queue forgets every waiter
// and holder, its fair queueing and pool state (nodes stay registered).
func (s *Store) Purge(context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.waiting = nil
	s.index = make(map[string]*waiter)
	s.holders = make(map[string]time.Time)
	s.fairState = newFairState()
	s.poolState = newPoolState()
	s.tokenState = newTokenState()
	return nil
}
