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

// refund is what a release of a ticket the node forgot carries: the
// correction of its flow's counter and the cooldown of its upstream.
type refund struct {
	correction float64
	cool       string
	coolFor    time.Duration
}

// refundFor records r for ticket id until settled is called (once the
// node's own call has returned); nothing where r carries nothing. Before
// the node forgets the ticket.
func (q *Queue) refundFor(id string, r refund) (settled func()) {
	if r == (refund{}) {
		return func() {}
	}
	q.refunds.Store(id, r)
	return func() { q.refunds.Delete(id) }
}

// refundOf is the refund a release of ticket id carries now (refundFor).
func (q *Queue) refundOf(id string) refund {
	if r, ok := q.refunds.Load(id); ok {
		return r.(refund)
	}
	return refund{}
}

// apply sets r in the arguments of a release.
func (r refund) apply(args *TicketArgs) {
	args.Correction, args.Cool, args.CoolFor = r.correction, r.cool, r.coolFor
}
