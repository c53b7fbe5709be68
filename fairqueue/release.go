package fairqueue

import (
	"context"
	"time"
)

// The release of a permit in the store by the node, outside a Permit's
// own Release: a ticket the node forgot, a ghost holder, a permit given
// back in the background.

// releaseID releases the permit of ticket id, which the node no longer
// knows (a ghost holder), in the store, with r, the refund of the node's
// own call on its way that gives it back (refundOf).
func (q *Queue) releaseID(id string, r refund) {
	args := q.releaseArgs(id)
	r.apply(&args)
	q.release(args)
}

// releaseArgs are the arguments of a release of ticket id, or of a
// transfer of its permit (a local handoff). Stamped before the settings
// are read (LimitsRead): a reload that the read missed comes after the
// stamp, and heads the reply names under the settings before it go
// (Heads), however late the call is sent.
func (q *Queue) releaseArgs(id string) TicketArgs {
	read := time.Now()
	return TicketArgs{ID: id, Node: q.node, Limits: q.cfg.Load().limits(), Tombstone: q.s.beatOnItsWay(), LimitsRead: read}
}

// inForceNow sets in args, the arguments of a release or transfer read
// some time before (releaseArgs), the settings in force now, stamped
// (LimitsRead) as releaseArgs stamps them: a call that waited for
// others before it goes out (a transfer queued behind those on their
// way, a release after a failed requeue and its cancel) dispatches
// under the settings a reload allows since, as every call sent from the
// reload on does, not under those before it.
func (q *Queue) inForceNow(args *TicketArgs) {
	args.LimitsRead = time.Now()
	args.Limits = q.cfg.Load().limits()
}

// release gives a permit back in the store (bounded by StoreTimeout).
func (q *Queue) release(args TicketArgs) {
	if q.closed.Load() {
		return // Leave released every permit of this node
	}
	ctx, cancel := context.WithTimeout(context.Background(), q.cfg.Load().StoreTimeout)
	defer cancel()
	err := q.store.Release(ctx, args)
	q.health.record(q.log, err)
	if args.Cool != "" {
		q.s.cooled(args.CoolFor) // its permit is handed on as it ends
	}
	if err != nil {
		// The permit may still be held in the store, for nobody (the node
		// forgot the ticket), and a node without waiters does not
		// reconcile: reconcile for a while, as after a failed transfer.
		q.s.note(evSweep, false)
	}
}

// releaseAsync releases the permit of ticket id, which the node no
// longer knows, in the background: with the refund of the node's own
// call on its way that gives it back (refundOf).
func (q *Queue) releaseAsync(id string) {
	r := q.refundOf(id)
	q.background(func() { q.releaseID(id, r) })
}
