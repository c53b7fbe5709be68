package fairqueue

import "time"

// Granted implements Listener: the store handed permits to tickets of this
// node.
func (q *Queue) Granted(grants ...Grant) {
	for _, g := range grants {
		t := q.lookup(g.Ticket)
		if t == nil {
			// Already cleaned up (its cancel raced the grant) or a ghost
			// of a call whose answer was lost: hand the permit on.
			q.releaseAsync(g.Ticket)
			continue
		}
		q.grant(t, g.No, g.Upstream)
		q.observe(g.No, "")
		if o := q.cfg.Load().Observer; o != nil && !g.At.IsZero() {
			o.Handoff(max(time.Since(g.At), 0))
		}
	}
}

// Resynced implements Listener: notifications may have been lost.
// A new subscription follows a broken connection, perhaps a failover
// that lost the last writes: the next heartbeat checks this node's
// waiters are still queued.
func (q *Queue) Resynced() {
	q.s.doubt()
	q.s.note(evVerify, true)
}

// observe records the grant counter and data-set ID a store call saw.
func (q *Queue) observe(grants int64, epoch string) {
	for {
		cur := q.grants.Load()
		if grants <= cur || q.grants.CompareAndSwap(cur, grants) {
			break
		}
	}
	q.s.sawEpoch(epoch)
}
