package storetest

import (
	"pgregory.net/rapid"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
)

// Rolling reloads in the differential test (differential.go): a reload
// may leave, until the next one, the old settings in force beside the
// new ones, as when one instance of a cluster has reloaded and another
// not yet. A ticket is acquired under either (the settings of the
// instance it arrived on, its weight clamped to them), and its later
// calls carry them; a reconcile, a heartbeat or a learned share's move
// carries either.

// limits draws the settings a call not tied to a ticket carries.
func (d *diff) limits(rt *rapid.T) fairqueue.Limits {
	if d.roll != nil && rapid.Bool().Draw(rt, "oldSettings") {
		return *d.roll
	}
	return d.lim
}

// ticketLimits is the settings the calls of tk carry.
func (d *diff) ticketLimits(tk *dTicket) fairqueue.Limits {
	if tk.node == "n2" {
		return d.n2Limits()
	}
	if tk.old && d.roll != nil {
		return *d.roll
	}
	return d.lim
}

// rolling starts a rolling reload from the settings old, or ends one:
// every ticket takes the settings in force.
func (d *diff) rolling(rt *rapid.T, old fairqueue.Limits) {
	d.roll = nil
	for _, t := range d.tickets {
		t.old = false
	}
	if rapid.IntRange(0, 2).Draw(rt, "rolling") == 0 {
		// Both carry the new tenant cap: the Redis store makes ready the
		// flows of a tenant whose cap a call raised at the next reconcile
		// only (see reload), which a call under each in turn would show.
		old.MaxInFlightPerTenant = d.lim.MaxInFlightPerTenant
		d.roll = &old
		d.logf("rolling: the old settings stay in force beside the new ones")
	}
}
