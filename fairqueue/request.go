package fairqueue

import (
	"crypto/sha256"
	"encoding/hex"
	"math"
	"strconv"
	"time"
)

// Request describes one acquire. The zero value is a plain FIFO request.
type Request struct {
	// Tenant is who the request is for (an API key, a user ID, a client
	// address): with Config.Fair, tenants share the permits fairly. It is
	// hashed before it reaches the store; "" is one default tenant.
	Tenant string
	// Weight is the tenant's share relative to others (2 = twice the
	// grants of a weight-1 tenant when both are backlogged), MinWeight
	// to MaxWeight: a value outside is taken as the nearest bound. Not
	// positive, NaN or unset: 1.
	Weight float64
	// Cost is the request's size in fairness accounting (e.g. its
	// max_tokens, or the seconds it is expected to hold the permit),
	// charged to its flow when it is granted; Permit.Charge replaces it
	// with what the request really used. A tenant of costly requests gets
	// fewer of them. Default 1, capped at MaxCost.
	Cost float64
	// Tokens is the KV-cache tokens the request holds while it runs
	// (its prompt tokens plus its completion budget), counted against
	// Config.KVTokens; a request heavier than the capacity is clamped to
	// it (Config.ClampTokens: it runs alone). Ignored without KVTokens.
	// A request granted weighing fewer than the config in force clamps it
	// to (a Reconfigure set or raised KVTokens while it waited) waits
	// again at its place, weighing that.
	Tokens int
	// MaxWait overrides Config.MaxWait for this request when > 0 and
	// shorter (a client that says how long it will wait).
	MaxWait time.Duration
	// OnQueued, when set, is called from Acquire's goroutine when the
	// ticket joins the queue (not when it is granted at once), with a
	// live view of its place for progress feedback; again, from
	// Requeue's goroutine, when a requeued ticket waits again.
	OnQueued func(Waiting)
	// Priority is the request's band, 0 (default, lowest) to MaxPriority
	// (with Config.Fair). A band is served PriorityFactor times as often
	// as the band below it when both are backlogged: a request of a
	// higher band overtakes the lower bands' backlog after at most one
	// request of each flow waiting (its flow starts level with the
	// least-served flow waiting, and an earlier one wins a tie), and a lower
	// band still gets at least one grant in every 1+PriorityFactor+...
	// (but for the lead of a flow that queues again while a request of it
	// runs: it keeps its counter, and takes PriorityFactor^band grants for
	// each unit of cost the flows waiting were charged meanwhile).
	Priority int

	// exit is the request's turn in the line of the store's waiters
	// moving into the fallback queue, once it came (awaitExit): until it
	// is passed, the request holds its place there (exitTurn.held).
	exit *exitTurn
}

// MaxPriority is the highest priority band.
const MaxPriority = 3

// flow names the request's place in fair queueing: its tenant (hashed)
// and band. Each flow is FIFO; flows interleave by their weights.
func (r Request) flow() string {
	return TenantKey(r.Tenant) + "." + strconv.Itoa(min(max(r.Priority, 0), MaxPriority))
}

// MaxCost bounds Request.Cost, so one request cannot push its tenant's
// place in the queue arbitrarily far.
const MaxCost = 1e6

// MinWeight and MaxWeight bound Request.Weight: a charge divided by a
// weight stays a finite number that moves its flow's counter (a
// subnormal weight made it +Inf, which the stores cannot count with).
// The Caddy handler's weights are bounded tighter (0.01 to 1000).
const (
	MinWeight = 1e-6
	MaxWeight = 1e6
)

// scale is what one unit of cost adds to r's flow's usage counter:
// 1 / (weight x factor^band), at least the least positive float64 (a
// factor^band beyond float64's range made it 0: a grant that never
// moved its flow).
func (r Request) scale(factor float64) float64 {
	w := r.Weight
	if !(w > 0) { // also NaN
		w = 1
	}
	w = min(max(w, MinWeight), MaxWeight)
	s := 1 / (w * math.Pow(factor, float64(min(max(r.Priority, 0), MaxPriority))))
	return max(s, math.SmallestNonzeroFloat64)
}

// charge is what units of cost add to a flow's counter at scale: never
// 0 for a positive number of units (a cost below 1 times the least
// positive float64, the scale of a band whose factor^band passes
// float64's range, rounds to 0: a grant that never moved its flow).
func charge(units, scale float64) float64 {
	c := units * scale
	if units > 0 && scale > 0 {
		c = max(c, math.SmallestNonzeroFloat64)
	}
	return c
}

// clampCost bounds a cost to (0, MaxCost]; a missing or invalid cost is 1.
func clampCost(c float64) float64 {
	if !(c > 0) {
		return 1
	}
	return min(c, MaxCost)
}

// TenantKey is the store's name for tenant: a fixed-length hash, so a
// tenant value (an API key) never reaches the store and cannot inject
// separators into key or ticket names.
func TenantKey(tenant string) string {
	sum := sha256.Sum256([]byte(tenant))
	return hex.EncodeToString(sum[:8])
}

// Waiting is a queued ticket's live view (Request.OnQueued). Its methods
// make no store call and are safe from any goroutine.
type Waiting struct {
	q *Queue
	t *ticket
}

// Position estimates the tickets ahead plus one (1 = next), from the
// queue's grants since the ticket was queued (read at each reconcile).
func (w Waiting) Position() int { return w.q.position(w.t) }

// ETA estimates the wait left from the observed grant rate; 0 when the
// rate or the position is not known.
func (w Waiting) ETA() time.Duration {
	pos := w.Position()
	if pos == 0 {
		return 0
	}
	return w.q.rate.eta(pos)
}

// position estimates the tickets ahead of t from the grants made since
// it was queued. 0 (unknown) when it was never queued, and while it is
// placed in a data set the store has lost since (Redis restarted
// empty): its place there counts from a grant counter that started
// over, until its node queues it again (reinstate).
func (q *Queue) position(t *ticket) int {
	pl := t.place.Load()
	if pl == nil || pl.position == 0 || pl.epoch != q.grantsOf.Load() {
		return 0
	}
	p := pl.position - int(q.grants.Load()-pl.grants0)
	return max(p, 1)
}

// place records where the store queued t: position, when the queue's
// grant counter read grants (observed first, so that it names the data
// set of that counter).
func (q *Queue) place(t *ticket, position int, grants int64) {
	t.place.Store(&place{position: position, grants0: grants, epoch: q.grantsOf.Load()})
}
