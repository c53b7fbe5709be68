package fairqueue

import "time"

// Granted implements Handler: the store handed permits to tickets of this
// node.
func (q *Queue) Granted(grants ...Grant) {
	for _, g := range grants {
		q.mu.Lock()
		t := q.tickets[g.Ticket]
		q.mu.Unlock()
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

// Resynced implements Handler: notifications may have been lost.
// A new subscription follows a broken connection, perhaps a failover
// that lost the last writes: the next heartbeat checks this node's
// waiters are still queued.
func (q *Queue) Resynced() {
	q.doubt()
	q.verify.Store(true)
	q.kickLoop()
}

// observe records the grant counter and data-set ID a store call saw.
func (q *Queue) observe(grants int64, epoch string) {
	for {
		cur := q.grants.Load()
		if grants <= cur || q.grants.CompareAndSwap(cur, grants) {
			break
		}
	}
	if epoch == "" {
		return
	}
	if old := q.seen.Load(); old == nil {
		q.seen.CompareAndSwap(nil, &epoch)
	} else if *old != epoch {
		// The store's data set changed (restart without persistence,
		// failover): the next heartbeat re-asserts our holders.
		q.doubt()
		q.resync.Store(true)
		q.kickLoop()
	}
}
