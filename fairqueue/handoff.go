package fairqueue

import (
	"context"
	"time"
)

// The local handoff. With a store shared by many nodes, handing a
// permit on costs a store round trip before the next request can start
// (the release, and a message to the waiter's node): on a busy machine
// most of the time between two requests on one permit. When the waiter
// that heads the queue is one of this node's own, and the store said so
// (Head, from the reply of an earlier release), the node starts it at
// once on the permit of the request that just ended and tells the store
// afterwards (Transferrer). Nothing is admitted twice: the permit stays
// counted in the store under the old holder until the transfer counts
// the waiter. Nobody is passed over: a ticket at the head of the queue
// stays there until it is granted or cancelled, since every later
// arrival queues behind it. Queues with fair queueing or an upstream
// pool do not hand on locally (another ticket may come first), nor does
// a node whose liveness the store has not confirmed for Lease/2 (its
// waiters may have been dropped as a dead node's).

// Head implements HeadHandler: the store says which of this node's
// tickets heads the queue ("" none).
func (q *Queue) Head(id string) {
	var t *ticket
	if id != "" {
		q.mu.Lock()
		t = q.tickets[id]
		q.mu.Unlock()
	}
	if t != nil && t.state.Load() != statePending {
		t = nil
	}
	q.head.Store(t)
}

// handOn hands the permit released by args straight to the node's
// waiter at the head of the queue, if the local handoff applies (see
// above), and records the move in the store. It reports whether it did;
// if not, the caller releases the permit in the store.
func (q *Queue) handOn(args TicketArgs) bool {
	tr, ok := q.store.(Transferrer)
	cfg := q.cfg.Load()
	if !ok || cfg.Fair || len(cfg.Upstreams) > 0 || !q.health.up() || q.closed.Load() ||
		time.Since(time.Unix(0, q.aliveAt.Load())) > cfg.Lease/2 {
		return false
	}
	t := q.head.Swap(nil)
	if t == nil || q.isDraining() || !t.state.CompareAndSwap(statePending, stateGranted) {
		return false // no own waiter heads the queue, or it left meanwhile
	}
	t.registered.Store(true)
	close(t.granted)
	if o := cfg.Observer; o != nil {
		o.Handoff(0)
	}
	ctx, cancel := context.WithTimeout(context.Background(), cfg.StoreTimeout)
	defer cancel()
	err := tr.Transfer(ctx, args, t.id)
	q.health.record(q.log, err)
	if err != nil {
		// The move may not have reached the store: release the old
		// holder as a release would have (its dispatch then grants the
		// waiter, who holds its permit already; the transfer, should it
		// run late, finds both done). The waiter, held here, is counted
		// again by the next heartbeat if the store does not have it.
		q.verify.Store(true)
		q.releaseAsync(args.ID)
	}
	return true
}
