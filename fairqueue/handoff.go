package fairqueue

import (
	"context"
	"runtime"
	"time"
)

// The local handoff. With a store shared by many nodes, handing a
// permit on costs a store round trip before the next request can start
// (the release, and a message to the waiter's node): on a busy machine
// most of the time between two requests on one permit. When the waiter
// that heads the queue is one of this node's own, and the store said so
// (Head, from the reply of an earlier release or transfer), the node
// starts it at once on the permit of the request that just ended and
// tells the store afterwards (Transferrer). The permit stays counted in
// the store under the old holder until the transfer counts the waiter
// instead. Nobody is passed over: a ticket at the head of the queue
// stays there until it is granted or cancelled, since every later
// arrival queues behind it. Where that could fail, the node hands on
// through the store: fair queueing, tokens or an upstream pool (here, or in use
// by another node: its requeue puts a ticket back at its arrival), more
// permits held than the permits (a lowered setting), and any doubt that
// the store still holds the node alive with its waiters (not confirmed
// by a heartbeat for half a lease, a new subscription, a changed data
// set, waiters found missing: a waiter reinstated is at the tail, and
// never handed on to locally).

// headTicket is the node's waiter that heads the queue, and the permits
// setting under which the store chose it.
type headTicket struct {
	t       *ticket
	permits int
}

// Head implements HeadListener: the store says which of this node's
// tickets heads the queue ("" none), chosen under permits.
func (q *Queue) Head(id string, permits int) {
	var t *ticket
	if id != "" {
		t = q.lookup(id)
	}
	if t == nil || t.state.Load() != statePending {
		q.s.head.Store(nil)
		return
	}
	q.s.head.Store(&headTicket{t: t, permits: permits})
}

// Woken counts the grants that have woken a waiter of this node so far:
// from the store (a release's reply, a Pub/Sub message, a grant found by
// reconcile) or by a local handoff. A caller that sees it move across
// its Release knows a waiter is ready to run (a concurrent grant may
// move it too).
func (q *Queue) Woken() uint64 { return q.s.woken.Load() }

// HeadIsOwn reports whether the store last said that one of this node's
// waiters heads the queue: a release now would likely start it at once
// (a local handoff) instead of making a store round trip first.
func (q *Queue) HeadIsOwn() bool { return q.s.head.Load() != nil }

// handOn hands the permit released by args straight to the node's
// waiter at the head of the queue, if the local handoff applies (see
// above), and records the move in the store. It reports whether it did;
// if not, the caller releases the permit in the store.
func (q *Queue) handOn(args TicketArgs) bool {
	tr, ok := q.store.(Transferrer)
	cfg := q.cfg.Load()
	if !ok || cfg.Fair || len(cfg.Upstreams) > 0 || cfg.KVTokens > 0 || !q.health.up() || !q.s.alive() {
		return false
	}
	// A background call: Close waits for it before the node leaves.
	q.bgMu.Lock()
	if q.closed.Load() {
		q.bgMu.Unlock()
		return false
	}
	q.bg.Add(1)
	q.bgMu.Unlock()
	defer q.bg.Done()
	h := q.s.head.Swap(nil)
	if h == nil || h.permits > cfg.limits().Permits {
		// No own waiter heads the queue, or the store chose it under more
		// permits than the settings now allow (a reply that crossed a
		// lowering reload): a transfer would keep the old concurrency,
		// where the store's dispatch applies the new permits.
		return false
	}
	t := h.t
	// Moving before granted: a heartbeat's snapshot that sees the grant
	// sees the move too, and leaves the waiter to the transfer.
	t.moving.Store(true)
	defer t.moving.Store(false)
	if t.reinstated.Load() || q.isDraining() || !t.state.CompareAndSwap(statePending, stateGranted) {
		return false // it left meanwhile
	}
	t.woken.Store(time.Now().UnixNano())
	t.registered.Store(true)
	close(t.granted)
	if o := cfg.Observer; o != nil && t.handoff.CompareAndSwap(false, true) {
		o.Handoff(0)
	}
	q.s.woken.Add(1)
	// Let the waiter run before the transfer's round trip: otherwise it
	// waits for this goroutine to park in the store call.
	runtime.Gosched()
	ctx, cancel := context.WithTimeout(context.Background(), cfg.StoreTimeout)
	defer cancel()
	err := tr.Transfer(ctx, args, t.id)
	q.health.record(q.log, err)
	if err != nil {
		// The move may not have reached the store: release the old
		// holder as a release would have (its dispatch then grants the
		// waiter, who holds its permit already). The waiter, held here,
		// is counted again by the next heartbeat if the store does not
		// have it. The transfer may still run late, after the waiter
		// ended: reconcile for a while finds such a ghost holder.
		q.s.note(evVerify|evSweep, true)
		q.releaseAsync(args.ID)
	}
	return true
}
