package memstore

import (
	"context"
	"slices"
	"time"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
)

// State is a snapshot of the queue, for tests and status pages.
type State struct {
	Waiting []string // in grant order
	Holders []string
	Nodes   []string
}

// State returns a snapshot of the queue.
func (s *Store) State() State {
	s.mu.Lock()
	defer s.mu.Unlock()
	var st State
	ws := append(waitHeap(nil), s.waiting...)
	slices.SortFunc(ws, func(a, b *waiter) int {
		switch {
		case before(a, b):
			return -1
		case before(b, a):
			return 1
		}
		return 0
	})
	for _, w := range ws {
		st.Waiting = append(st.Waiting, w.id)
	}
	for id := range s.holders {
		st.Holders = append(st.Holders, id)
	}
	for n := range s.nodes {
		st.Nodes = append(st.Nodes, n)
	}
	return st
}

// Inspect implements fairqueue.Inspector.
func (s *Store) Inspect(_ context.Context, head, flows int) (fairqueue.Snapshot, error) {
	st := s.State()
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now()
	snap := fairqueue.Snapshot{Waiting: len(st.Waiting), Head: st.Waiting[:min(max(head, 0), len(st.Waiting))], Grants: s.grants}
	for id, exp := range s.holders {
		snap.Holders = append(snap.Holders, fairqueue.Holder{Ticket: id, Node: fairqueue.TicketNode(id), LeaseLeft: exp.Sub(now)})
	}
	for n, exp := range s.nodes {
		snap.Nodes = append(snap.Nodes, fairqueue.NodeInfo{ID: n, Alive: !exp.Before(now), ExpiresIn: exp.Sub(now)})
	}
	for f, n := range s.twait {
		snap.Flows = append(snap.Flows, fairqueue.FlowInfo{Flow: f, Waiting: n})
	}
	slices.SortFunc(snap.Flows, func(a, b fairqueue.FlowInfo) int { return b.Waiting - a.Waiting })
	snap.Flows = snap.Flows[:min(max(flows, 0), len(snap.Flows))]
	return snap, nil
}

// Purge implements fairqueue.Inspector: the queue forgets every waiter
// and holder (nodes stay registered).
func (s *Store) Purge(context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.waiting = nil
	s.index = make(map[string]*waiter)
	s.holders = make(map[string]time.Time)
	s.tlast = make(map[string]float64)
	s.twait = make(map[string]int)
	s.vtime = 0
	return nil
}
