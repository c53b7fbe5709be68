package fairqueue

import (
	"sync"
	"sync/atomic"
	"time"
)

// Ticket states. A ticket leaves pending exactly once, by compare-and-set.
const (
	statePending int32 = iota
	stateGranted
	stateTimedOut
	stateCancelled
	stateRejected
)

// ticket is one request's place in the queue, as this node knows it.
type ticket struct {
	id      string
	state   atomic.Int32
	granted chan struct{} // closed on the move to granted
	// failOpen: admitted while the store was unreachable; registered in
	// the store by the next heartbeat (adopted).
	failOpen   bool
	registered atomic.Bool // the store knows it as a holder
	// queued: the store answered its acquire and queued it, so a
	// heartbeat may ask whether the store still has it.
	queued atomic.Bool
	// requeued: the store lost it and the node queued it again (at the
	// tail); moving: granted by a local handoff whose transfer is on its
	// way (see handOn).
	requeued, moving atomic.Bool
	cost             float64 // TicketArgs.Cost, to queue it again with the same cost
	scale            float64 // what one unit of Request.Cost adds to its flow's counter

	// upstream is the pool upstream of its grant (Config.Upstreams).
	upstream atomic.Pointer[string]
	grantNo  atomic.Int64 // 0 until known: a grant found by reconcile learns it from its late message
	// Written before wait starts.
	seq      int64
	position int
	grants0  int64
}

// Permit is a granted ticket. Release it when the work it guards ends.
type Permit struct {
	q      *Queue
	t      *ticket
	waited time.Duration
	once   sync.Once
	local  *Permit // the fallback queue's permit (Config.Fallback)
	used   atomic.Pointer[float64]
	cool   atomic.Pointer[time.Duration] // Cool: the upstream cools this long at release
	// For Requeue: the request and the end of its wait.
	req      Request
	start    time.Time
	deadline time.Time
}

// Charge records what the request really used, in the units of
// Request.Cost (seconds held, tokens): at Release, its flow's usage
// counter is corrected from the estimate it was charged at the grant to
// this (fair queueing; bounded to MaxCost). Without Charge, the estimate
// stands. The last call before Release counts.
func (p *Permit) Charge(used float64) {
	p.used.Store(&used)
}

// Release gives the permit back; the store hands it to the next waiter
// at once. It is idempotent and safe from any goroutine.
func (p *Permit) Release() {
	p.once.Do(p.releaseNow)
}

func (p *Permit) releaseNow() {
	if p.local != nil {
		if d := p.cool.Load(); d != nil {
			p.local.Cool(*d)
		}
		p.local.Release()
	}
	p.q.forget(p.t)
	if p.t.failOpen && !p.t.registered.Load() {
		return
	}
	args := p.q.releaseArgs(p.t.id)
	if u := p.used.Load(); u != nil && p.t.scale > 0 {
		args.Correction = min(max(*u, 0), MaxCost)*p.t.scale - p.t.cost
	}
	if d := p.cool.Load(); d != nil && p.local == nil {
		if up := upstreamOf(p.t); up != "" {
			args.Cool, args.CoolFor = up, *d
		}
	}
	if p.local == nil && !p.t.failOpen && args.Correction == 0 && args.Cool == "" && p.q.handOn(args) {
		return
	}
	p.q.release(args)
}

// Ticket returns the ticket ID ("<node>:<counter>").
func (p *Permit) Ticket() string { return p.t.id }

// Waited returns how long Acquire waited.
func (p *Permit) Waited() time.Duration { return p.waited }

// Position returns the number of tickets that were ahead at enqueue plus
// one, or 0 when the permit was granted at once.
func (p *Permit) Position() int { return p.t.position }

// Seq returns the arrival order the store assigned to the ticket; 0 for a
// fail-open permit.
func (p *Permit) Seq() int64 { return p.t.seq }

// GrantNo returns the queue's grant counter at this grant (grants are
// numbered in the order the store made them); 0 while unknown (a grant
// found by reconcile before its message arrived).
func (p *Permit) GrantNo() int64 { return p.t.grantNo.Load() }

// FailOpen reports whether the permit was admitted without the store
// (Config.FailOpen while the store was unreachable).
func (p *Permit) FailOpen() bool { return p.t.failOpen && p.local == nil }

// Local reports whether the permit came from the node's local fallback
// queue (Config.Fallback while the store was unreachable).
func (p *Permit) Local() bool { return p.local != nil }
