package fairqueue

import "context"

// The end of a ticket that never ran: its caller left, timed out or was
// drained, or its store call failed. Whatever grant the store made it
// meanwhile is handed on and taken back from its flow's usage counter
// (fair queueing): the request ran nowhere.

// giveBack releases the permit of a granted ticket whose caller has gone.
// The request ran nowhere: its flow is charged nothing for the grant (as
// for one requeued), so its tenant's next request is not put behind
// others' for service it never had.
func (q *Queue) giveBack(t *ticket) {
	p := &Permit{q: q, t: t}
	if TicketFlow(t.id) != "" {
		p.Charge(0)
	}
	p.Release()
}

// cleanup forgets a ticket that ends without a permit and removes it from
// the store. It is idempotent; the store call is bounded by StoreTimeout.
func (q *Queue) cleanup(t *ticket, tombstone bool) {
	q.forgetUnused(t)
	q.cancelInStore(t, tombstone, true)
}

// forgetUnused forgets t, which never ran; its cancel (cancelInStore,
// unused) follows. The store may grant t before that cancel reaches it:
// the node, which knows t no more, releases such a grant (Granted, a
// reconcile), and that release carries the cancel's refund (refundFor),
// so the flow is charged nothing whichever of the two lands first.
func (q *Queue) forgetUnused(t *ticket) {
	if TicketFlow(t.id) != "" {
		q.refunds.Store(t.id, refund{correction: -t.cost})
	}
	q.forget(t)
}

// cancelInStore takes t out of the store (Store.Cancel). unused: the
// node never started t (forgetUnused), so a grant the cancel finds ran
// nowhere and its flow is charged nothing for it (as for a requeued
// permit); else (t may have run: a reinstated ticket that ended
// meanwhile) the charge stands.
func (q *Queue) cancelInStore(t *ticket, tombstone, unused bool) {
	cfg := q.cfg.Load()
	ctx, cancel := context.WithTimeout(context.Background(), cfg.StoreTimeout)
	defer cancel()
	args := TicketArgs{ID: t.id, Node: q.node, Limits: cfg.limits(), Tombstone: tombstone}
	if unused && TicketFlow(t.id) != "" {
		args.Correction = -t.cost
		defer q.refunds.Delete(t.id)
	}
	err := q.store.Cancel(ctx, args)
	if !tombstone { // after a failed acquire, one failure is counted already
		q.health.record(q.log, err)
	}
}
