package fairqueue

import "time"

// Granted implements Listener: the store handed permits to tickets of this
// node.
func (q *Queue) Granted(grants ...Grant) {
	for _, g := range grants {
		t := q.lookup(g.Ticket)
		if t == nil {
			// Already cleaned up (its cancel raced the grant) or a ghost
			// of a call whose answer was lost: hand the permit on. Not
			// one whose permit the node handed on locally, its transfer
			// queued: that transfer takes the entry out (or releases it).
			if !q.handingOn(g.Ticket) {
				q.releaseAsync(g.Ticket)
			}
			continue
		}
		if !q.s.grantTrusted(g.At, q.cfg.Load().Lease) {
			// Maybe a grant the store took back while this node was
			// stopped or cut off (its message unread since before the
			// last heartbeat, maybe): leave the waiter waiting, and ask the
			// store at once (evRecheck). The reconcile grants the waiter
			// if the store still counts its grant; the heartbeat after it
			// names every waiter and finds the ones the store dropped
			// (it queues them again). Not evVerify: grants arriving
			// while a heartbeat is on its way would keep it from
			// confirming the node; a recheck asks for the waiters only
			// once its reconcile is done.
			q.s.note(evRecheck, true)
			continue
		}
		q.grant(t, g.No, g.Upstream, g.Permits)
		q.s.woken.Add(1)
		q.observe(g.No, "")
		q.observeHandoff(t, g.At)
	}
}

// observeHandoff reports t's handoff to the Observer, once: from the
// store's grant, made at at, to the wake-up of t's waiter. The wake-up
// may have come first: reconcile finds a grant whose message is late. A
// local handoff was observed as it started the waiter (as 0): another
// node's grant of the same ticket that crossed it adds nothing. A ticket
// not woken by a grant (it left the queue) or a grant of unknown time
// reports nothing.
func (q *Queue) observeHandoff(t *ticket, at time.Time) {
	o := q.cfg.Load().Observer
	woken := t.woken.Load()
	if o == nil || at.IsZero() || woken == 0 || !t.handoff.CompareAndSwap(false, true) {
		return
	}
	o.Handoff(max(time.Unix(0, woken).Sub(at), 0))
}

// Resynced implements Listener: notifications may have been lost.
// A new subscription follows a broken connection, perhaps a failover
// that lost the last writes. The node heartbeats at once (evResync),
// waiters or not: a grant (or requeue) the failover lost left a running
// request uncounted, and every other node's request would run beside it,
// above the permits, until the next heartbeat (up to a third of a lease)
// counted it again; that heartbeat also checks this node's waiters are
// still queued. And the node reconciles for a while (as after a failed
// release), even without waiters: a release the failover lost left its
// permit held in the store for a request that has ended, which would
// keep every waiter of the queue out until its lease ended; reconcile
// finds it among this node's holders and releases it again.
func (q *Queue) Resynced() {
	q.s.doubt()
	q.s.note(evVerify|evResync|evSweep, true)
}

// observe records the grant counter and data-set ID a store call saw.
func (q *Queue) observe(grants int64, epoch string) {
	if epoch != "" {
		if old := q.grantsOf.Load(); old == nil || *old != epoch {
			// A new data set (Redis restarted empty, the queue purged):
			// its counter started over, and positions count from it.
			if q.grantsOf.CompareAndSwap(old, &epoch) && old != nil {
				q.grants.Store(grants)
			}
		}
	}
	for {
		cur := q.grants.Load()
		if grants <= cur || q.grants.CompareAndSwap(cur, grants) {
			break
		}
	}
	q.s.sawEpoch(epoch)
}
