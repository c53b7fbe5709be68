package fairqueue

import "sync/atomic"

// Ticket states. A ticket leaves pending exactly once, by compare-and-set.
const (
	statePending int32 = iota
	stateGranted
	stateTimedOut
	stateCancelled
	stateRejected
	// stateMoved: it left the store's queue for the fallback queue
	// (Queue.storeDown), its request waits there.
	stateMoved
)

// ticket is one request's place in the queue, as this node knows it.
type ticket struct {
	id      string
	no      uint64 // its counter in id: the node's tickets in the order made
	state   atomic.Int32
	granted chan struct{} // closed on the move to granted
	// failOpen: admitted while the store was unreachable; registered in
	// the store by the next heartbeat (adopted). local: of those, served
	// by a fallback queue (whose store counts it), not let in by fail open.
	failOpen, local bool
	registered      atomic.Bool // the store knows it as a holder
	// queued: the store answered its acquire and queued it, so a
	// heartbeat may ask whether the store still has it.
	queued atomic.Bool
	// reinstated: the store lost it and the node queued it again (at the
	// tail); moving: granted by a local handoff whose transfer is on its
	// way (see handOn); unsent: granted by a local handoff whose transfer
	// failed (the store may still have it waiting).
	reinstated, moving, unsent atomic.Bool
	cost                       float64 // TicketArgs.Cost, to queue it again with the same cost
	scale                      float64 // what one unit of Request.Cost adds to its flow's counter
	tokens                     int     // TicketArgs.Tokens: Request.Tokens, clamped
	asks                       int     // TicketArgs.Asks: Request.Tokens where clamped, else 0

	// upstream is the pool upstream of its grant (Config.Upstreams).
	upstream atomic.Pointer[string]
	grantNo  atomic.Int64 // 0 until known: a grant found by reconcile learns it from its late message
	// grantPermits: Grant.Permits of the grant that moved it out of
	// pending; 0: unknown.
	grantPermits atomic.Int64
	// woken: when a grant moved it out of pending (Unix ns; 0: not
	// woken by a grant); handoff: its handoff was observed (once).
	woken   atomic.Int64
	handoff atomic.Bool
	// place is where the store last queued it, for its live position
	// (Queue.position): set when it is queued, and again when its node
	// queues it anew after the store lost it (reinstate).
	place atomic.Pointer[place]
	// exit is its turn among the store's waiters moving into the
	// fallback queue, set before it moves to stateMoved.
	exit atomic.Pointer[exitTurn]
	// Written before wait starts.
	seq      int64
	position int // its place when it was first queued; 0: granted at once
}

// place is where the store queued a ticket: its position then, the
// queue's grant counter then, and the data set (epoch) that counter
// belongs to.
type place struct {
	position int
	grants0  int64
	epoch    *string // Queue.grantsOf when placed
}

// heldWeight is what ticket t, granted by the store, weighs for the
// node under cfg: its tokens, or, where it was clamped (ticket.asks),
// what it asks clamped by cfg where that is more. The store weighs a
// waiter at its grant by what it asks, bounded by the capacity of the
// call that grants it (TicketArgs.Asks): a grant by another node whose
// kv_tokens a reload raised first holds more than the node clamped it
// to, and the node's reweigh, under the capacity it had then, left it
// so. Counted lighter, the node's fallback queue (dealt its part from
// what its requests held in the store) would admit the difference above
// that part, and a store that lost the grant would count it again
// (heartbeat) lighter than it granted it. Where the grant counted less
// (made under the old capacity), the count errs on the safe side.
func heldWeight(cfg *Config, t *ticket) int {
	if t.asks > t.tokens {
		if w, _ := cfg.ClampTokens(t.asks); w > t.tokens {
			return w
		}
	}
	return t.tokens
}
