package fairqueue

import (
	"cmp"
	"context"
	"errors"
	"slices"
	"time"
)

// The move of the store's waiters into the fallback queue
// (Config.Fallback) when the store is marked down: they would wait there
// for a grant that cannot come until their max wait, while the requests
// that come during the outage are served ahead of them by the fallback
// queue. They wait in the fallback queue instead, entering it in the
// order they waited in the store's (their seq), ahead of the requests
// that come after, and are served there in its order (fair or FIFO). The way back, once the store is back, is moveIn's.

// errMovedOut ends the wait of a ticket that left the store's queue for
// the fallback queue (Queue.wait): its request waits there (moveOut).
var errMovedOut = errors.New("fair queue: moved into the fallback queue")

// exitTurn is a request's number in the line of the store's waiters
// moving into the fallback queue.
type exitTurn struct {
	line *moveLine
	n    uint64
}

// storeDown runs as the store is marked down (health.onDown), before any
// request sees it down. With a fallback queue, each waiter of the
// store's queue leaves it: its ticket moves from pending to moved by
// compare-and-set, as a wait that ends does (a grant that came first
// wins, and is served), and is cancelled in the store in the background,
// as such a wait's is. That cancel fails while the store is down: a grant
// the store made the ticket, or makes it later, finds the node knowing it
// no more, and is given back (Granted, reconcile), as for any cancelled
// ticket. The waiters are numbered in the order they waited (seq), and a
// request that comes meanwhile numbers itself behind them (joinExit):
// each enters the fallback queue once those before it are queued there,
// and the fallback queue grants none of them until all are
// (holdLocal).
func (q *Queue) storeDown() {
	if q.cfg.Load().Fallback == nil {
		return
	}
	var ts []*ticket
	q.mu.Lock()
	for _, t := range q.tickets {
		// queued: its acquire was answered (and its seq written).
		if t.state.Load() == statePending && t.queued.Load() {
			ts = append(ts, t)
		}
	}
	q.mu.Unlock()
	slices.SortFunc(ts, func(a, b *ticket) int { return cmp.Or(cmp.Compare(a.seq, b.seq), cmp.Compare(a.no, b.no)) })
	// The line of an earlier mark's move whose waiters still move (the
	// store answered for a moment, then was marked down again): the
	// waiters of this one go behind them, and so do the requests that
	// come. A new line, empty where this mark finds no waiter, let those
	// requests into the fallback queue ahead of the waiters still moving.
	line := q.exiting.Load()
	first, behind := uint64(0), false
	if line != nil {
		first, behind = line.extend(len(ts))
	}
	if !behind {
		line = newMoveLine()
		first = line.takeN(len(ts))
	}
	if len(ts) > 0 {
		// Its waiters numbered first to last below; the hold of the
		// earlier move, if on, ends before theirs.
		q.holdLocal(&exitTurn{line: line, n: first + uint64(len(ts)) - 1})
	}
	for i, t := range ts {
		turn := &exitTurn{line: line, n: first + uint64(i)}
		t.exit.Store(turn)
		if !t.state.CompareAndSwap(statePending, stateMoved) {
			line.pass(turn.n) // granted, or its wait ended: it stays
			continue
		}
		q.forgetUnused(t)
		q.background(func() { q.cancelInStore(t, true, true) })
	}
	q.exiting.Store(line)
	woken := make(chan struct{})
	close(*q.exits.Swap(&woken))
}

// localSet moves the store's waiters into the fallback queue where a
// reload (old to cfg) sets a fallback queue during an outage, ahead of
// the requests that come from now, as they move where the store is
// marked down under it (storeDown, which found no fallback queue at the
// mark). Left waiting for the store, they waited until their max wait
// while the fallback queue served the requests after them.
func (q *Queue) localSet(old, cfg *Config) {
	if old.Fallback == nil && cfg.Fallback != nil {
		q.health.whileDown(q.storeDown)
	}
}

// missedMove takes t, just queued in the store's queue, out of it when
// the store was marked down since its call was answered: storeDown moves
// the waiters it finds queued, and one whose answer came in as it ran
// was not yet (the node's acquire saw the store up and no fallback
// queue): it waited in the store's queue for a grant that cannot come
// until its max wait, while the fallback queue served the requests that
// came after it. It leaves as storeDown's waiters do (a grant that came
// first wins, and is served; one storeDown moved goes as they do), its
// ticket cancelled in the store in the background. It reports whether t
// left: its request waits in the fallback queue, behind those storeDown
// moves (joinExit).
func (q *Queue) missedMove(t *ticket) bool {
	if q.cfg.Load().Fallback == nil || !q.health.markedDown() {
		return false
	}
	if !t.state.CompareAndSwap(statePending, stateCancelled) {
		return false // granted, or moved by storeDown: its wait answers it
	}
	q.forgetUnused(t)
	q.background(func() { q.cancelInStore(t, true, true) })
	return true
}

// holdLocal has the fallback queue (the one in use, or the one opened
// next) give no permit until every number of line h.line up to h.n has
// passed: until each of the store's waiters moving there is queued (or
// gone). Entering one by one while it had a permit free, the first to
// enter was granted at once, whatever the fair order (Config.Fair:
// tenants, priority bands) would have served: those entering once it
// was granted queued behind it, a later tenant's or band's waiter
// starting level with those still waiting and ranked by its arrival.
// Queued together, they are served in the fallback queue's fair order,
// as the store's queue would have served them from equal usage. Once
// they are, the fallback queue is woken to grant them.
func (q *Queue) holdLocal(h *exitTurn) {
	q.localMu.Lock()
	q.entering = h
	if r := q.running.Load(); r != nil {
		r.holdFor(h)
	}
	q.localMu.Unlock()
	h.line.whenPassed(h.n, q.wakeLocal)
}

// holdFor makes h the hold of s (Queue.holdLocal).
func (s *storeRunning) holdFor(h *exitTurn) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.hold = h
}

// holding reports whether s's hold (Queue.holdLocal) is on, forgetting it
// once it is over (with s.mu held).
func (s *storeRunning) holding() bool {
	if s.hold == nil {
		return false
	}
	if s.hold.line.passedTo(s.hold.n) {
		s.hold = nil
		return false
	}
	return true
}

// held is l under a hold (Queue.holdLocal): no permit, on no upstream.
// The queue caps stand: the waiters moving in are at most those the
// store's queue held under them, and the requests that come meanwhile
// enter behind them, once the hold is over (joinExit).
func held(l Limits) Limits {
	l.Permits = 0
	if len(l.Upstreams) > 0 {
		ups := make([]Upstream, len(l.Upstreams))
		for i, u := range l.Upstreams {
			u.Permits = 0
			ups[i] = u
		}
		l.Upstreams = ups
	}
	return l
}

// joinExit numbers a request that goes to the fallback queue behind the
// store's waiters still moving there, and returns its turn; nil once
// every one of them is queued there (or gone), and the line is
// forgotten.
func (q *Queue) joinExit() *exitTurn {
	l := q.exiting.Load()
	if l == nil {
		return nil
	}
	if n, ok := l.join(); ok {
		return &exitTurn{line: l, n: n}
	}
	q.exiting.CompareAndSwap(l, nil)
	return nil
}

// held reports whether turn, one that came (awaitExit), is not yet
// passed: its request, sent to the store's queue meanwhile (toStore),
// holds its place in the line still. Back for the fallback queue (its
// call failed, the store was marked down again), it goes there in that
// place, ahead of the requests behind it, not numbered anew (joinExit)
// behind the store's waiters that mark moved, which came after it.
func (turn *exitTurn) held() bool {
	return turn != nil && !turn.line.passedTo(turn.n)
}

// toStore is moveLine.toStore for the request whose turn (if any) came:
// it goes to the store's queue.
func (turn *exitTurn) toStore() {
	if turn != nil {
		turn.line.toStore(turn.n)
	}
}

// moveOut sends to the fallback queue the request of t, which left the
// store's queue (storeDown), in its turn, with what is left of its max
// wait. from: as unavailable's.
func (q *Queue) moveOut(ctx context.Context, t *ticket, req Request, start, deadline time.Time, from *moveLine) (*Permit, error) {
	turn := t.exit.Load()
	defer turn.line.pass(turn.n) // whatever answers it: a reload may have changed the policy
	return q.unavailable(ctx, req, start, deadline, errStoreDown, turn, from)
}

// awaitExit waits for turn, a request's turn to enter the fallback
// queue, and returns req, whose OnQueued lets the next one go once it is
// queued there. The caller passes turn once the request leaves.
func (q *Queue) awaitExit(ctx context.Context, turn *exitTurn, req Request, start, deadline time.Time) (Request, error) {
	switch turn.line.wait(ctx, turn.n, deadline, q.drainCh) {
	case turnCancelled:
		return req, ctx.Err()
	case turnTimedOut:
		return req, q.reject(ReasonTimeout, start, 0, nil)
	case turnDrained:
		return req, q.reject(ReasonShuttingDown, start, 0, nil)
	}
	req.exit = turn
	onQueued := req.OnQueued
	req.OnQueued = func(w Waiting) {
		turn.line.pass(turn.n) // queued in the fallback queue: the next one goes
		if onQueued != nil {
			onQueued(w)
		}
	}
	return req, nil
}
