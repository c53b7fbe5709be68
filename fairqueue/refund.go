package fairqueue

import "time"

// The refunds of permits given back while the call that gives them back
// is on its way. The node forgets a ticket as it sends that call (a
// release with a correction or a cooldown, a requeue, an unused ticket's
// cancel); a reconcile or a heartbeat that finds the ticket's grant
// meanwhile, unknown to the node, releases it as a ghost, and may reach
// the store first. That release carries what the node's own call
// carries, so the flow is charged, and the upstream cools, as the node's
// call says whichever of the two lands first: only the one that finds
// the permit held applies it.
//
// A cooldown is kept after the node's call has landed, until it ends: a
// failover may lose that call (the last writes), and the reconcile after
// the resubscribe, which releases the permit Redis holds again as a
// ghost, cools the upstream for what is left of it (a refused upstream
// would otherwise get the next request at once). The correction is not
// kept: the holder a failover brings back was charged at its grant, but
// one a heartbeat counted again after its release was not, and the node
// cannot tell the two apart.

// refund is what a release of a ticket the node forgot carries: the
// correction of its flow's counter and the cooldown of its upstream.
type refund struct {
	correction float64
	cool       string
	coolFor    time.Duration
	// coolUntil is when a cooldown kept after the call landed ends
	// (refundFor); zero while the call is on its way.
	coolUntil time.Time
}

// refundFor records r for ticket id until settled is called (once the
// node's own call has returned), and its cooldown until that ends;
// nothing where r carries nothing. Before the node forgets the ticket.
func (q *Queue) refundFor(id string, r refund) (settled func()) {
	if r == (refund{}) {
		return func() {}
	}
	q.refunds.Store(id, r)
	return func() {
		if r.cool == "" || r.coolFor <= 0 {
			q.refunds.Delete(id)
			return
		}
		kept := refund{cool: r.cool, coolUntil: time.Now().Add(r.coolFor)}
		q.refunds.Store(id, kept)
		time.AfterFunc(r.coolFor, func() { q.refunds.CompareAndDelete(id, kept) })
	}
}

// refundOf is the refund a release of ticket id carries now (refundFor).
// A kept cooldown carries what is left of it (nothing once it ended):
// the upstream's cooldown ends when the node's own call said.
func (q *Queue) refundOf(id string) refund {
	v, ok := q.refunds.Load(id)
	if !ok {
		return refund{}
	}
	r := v.(refund)
	if !r.coolUntil.IsZero() {
		left := time.Until(r.coolUntil)
		if left <= 0 {
			return refund{}
		}
		r.coolFor, r.coolUntil = left, time.Time{}
	}
	return r
}

// apply sets r in the arguments of a release.
func (r refund) apply(args *TicketArgs) {
	args.Correction, args.Cool, args.CoolFor = r.correction, r.cool, r.coolFor
}
