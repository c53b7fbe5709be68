package fairqueue

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"
)

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
	var r refund
	if u := p.used.Load(); u != nil && p.t.scale > 0 {
		r.correction = charge(min(max(*u, 0), MaxCost), p.t.scale) - p.t.cost
	}
	// A local permit's cooldown goes to the store too: Redis adopted it
	// (registered), or may, its release then a ghost's; the fallback
	// queue's store has it (above), and Redis hands on the permit.
	if d := p.cool.Load(); d != nil {
		if up := upstreamOf(p.t); up != "" {
			r.cool, r.coolFor = up, *d
			if p.t.failOpen && p.local == nil {
				// No store has it: the node's next fail-open permits
				// leave the upstream out (localUpstream).
				p.q.noteCool(up, *d)
			}
		}
	}
	// A ghost release of the ticket (a reconcile, a heartbeat's) that
	// lands first carries them too.
	settled := p.q.refundFor(p.t.id, r)
	defer settled()
	p.q.forget(p.t)
	if p.t.failOpen && !p.t.registered.Load() {
		return
	}
	args := p.q.releaseArgs(p.t.id)
	r.apply(&args)
	if p.local == nil && !p.t.failOpen && args.Correction == 0 && args.Cool == "" && p.q.handOn(args) {
		return
	}
	p.q.release(args)
}

// Ticket returns the ticket ID ("<node>:<counter>").
func (p *Permit) Ticket() string { return p.t.id }

// Waited returns how long Acquire waited.
func (p *Permit) Waited() time.Duration { return p.waited }

// Deadline returns the end of the request's wait, its max wait counted
// from its first arrival: a Requeue waits no later. A permit admitted
// without the store (fail open, the fallback queue) has one too: its
// Requeue asks again, until then.
func (p *Permit) Deadline() time.Time { return p.deadline }

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

// GrantedUnder returns the permits setting of the store call that made
// the grant (Grant.Permits): no more holders than that ran when it was
// made. 0 when unknown (found by reconcile, a fail-open or local permit,
// or a grant of a node of an earlier version).
func (p *Permit) GrantedUnder() int {
	if p.t.failOpen {
		return 0
	}
	return int(p.t.grantPermits.Load())
}

// FailOpen reports whether the permit was admitted without the store
// (Config.FailOpen while the store was unreachable).
func (p *Permit) FailOpen() bool { return p.t.failOpen && p.local == nil }

// Local reports whether the permit came from the node's local fallback
// queue (Config.Fallback while the store was unreachable).
func (p *Permit) Local() bool { return p.local != nil }

// Tokens returns the KV-cache tokens the permit counts against
// Config.KVTokens: its Request.Tokens, clamped (Config.ClampTokens); 0
// when the queue does not count tokens.
func (p *Permit) Tokens() int { return p.t.tokens }

// Upstream returns the upstream the permit was granted on (Config.Upstreams),
// or "" when the queue has no pool.
func (p *Permit) Upstream() string {
	if p.local != nil {
		return p.local.Upstream()
	}
	if u := p.t.upstream.Load(); u != nil {
		return *u
	}
	return ""
}

// Cool asks that the permit's upstream be left out of dispatch for d
// (across the cluster) from its Release: it failed the request (refused
// the connection, timed out, answered 503). d <= 0 is DefaultCooldown;
// it is bounded by MaxCooldown. A permit without an upstream ignores it.
func (p *Permit) Cool(d time.Duration) {
	d = coolFor(d)
	p.cool.Store(&d)
}

func coolFor(d time.Duration) time.Duration {
	if d <= 0 {
		return DefaultCooldown
	}
	return min(d, MaxCooldown)
}

// errReleased is returned by Requeue on a permit already released.
var errReleased = errors.New("fair queue: requeue of a released permit")

// Requeue gives the permit back and waits again at the request's place
// in the queue (before every request that arrived after it), as one
// store step: an upstream refused the request before anything was sent
// to the client. The upstream cools for cool (see Cool; cool < 0: it
// does not cool). The wait ends as Acquire's does, at the first
// Acquire's max wait; the request's flow is not charged for the grant
// given back, whether it waits again or not (its max wait is over, ctx
// ended, the store failed). The Permit must not be used afterwards;
// Release the returned one.
func (p *Permit) Requeue(ctx context.Context, cool time.Duration) (*Permit, error) {
	return p.requeue(ctx, cool, p.t.tokens)
}

// reweigh waits again at its place, weighing its tokens as the config
// in force clamps them, a request granted weighing fewer: it was queued
// under a config that counted none (a reload turned KVTokens on while it
// waited) or clamped it to a smaller capacity (a reload raised it), and
// run as granted it would hold the difference uncounted, beside grants
// that fill the capacity. A grant made under the raised capacity weighed
// it in full already (TicketArgs.Asks), and nothing passed it: the
// requeue finds it first, with room. One made under the old capacity
// (another instance's in a rolling reload, a call sent before the
// reload) did not, nor one under a config that counted none. Otherwise
// it returns p.
func (p *Permit) reweigh(ctx context.Context) (*Permit, error) {
	if p.local != nil || p.t.failOpen {
		return p, nil
	}
	cfg := p.q.cfg.Load() // with its defaults: KVTokens is the pool's where it sets none
	if cfg.KVTokens <= 0 {
		return p, nil
	}
	w, _ := cfg.ClampTokens(p.req.Tokens)
	if w <= p.t.tokens {
		return p, nil
	}
	return p.requeue(ctx, -1, w)
}

// requeue is Requeue, the new ticket weighing tokens.
func (p *Permit) requeue(ctx context.Context, cool time.Duration, tokens int) (*Permit, error) {
	claimed := false
	p.once.Do(func() { claimed = true })
	if !claimed {
		return nil, errReleased
	}
	q := p.q
	if p.local != nil || p.t.failOpen {
		// Admitted without the store: no place to keep; ask again. The
		// local queue cools the upstream as the store would.
		if cool >= 0 {
			p.Cool(cool)
		}
		p.releaseNow()
		req := p.req
		req.MaxWait = time.Until(p.deadline)
		if req.MaxWait <= 0 {
			return nil, q.reject(ReasonTimeout, p.start, 0, nil)
		}
		return q.Acquire(ctx, req)
	}
	if !q.health.up() || q.inFallback() {
		// The store is down, or the node still serves from its fallback
		// queue: the request waits again as an Acquire's would
		// (on_store_error), its permit given back, its flow charged
		// nothing for it.
		if TicketFlow(p.t.id) != "" {
			p.Charge(0)
		}
		if cool >= 0 {
			p.Cool(cool)
			q.coolLocal(p.Upstream(), coolFor(cool), false) // before the release hands its permit on there
		}
		p.releaseNow()
		if !time.Now().Before(p.deadline) {
			// As below: no wait left (fail open would admit it again).
			return nil, q.reject(ReasonTimeout, p.start, 0, nil)
		}
		return q.unavailable(ctx, p.req, p.start, p.deadline, errStoreDown, nil, nil)
	}
	// Where no requeue gives the permit back, this release does, as the
	// requeue would have: the refused grant ran nowhere (its charge is
	// taken back) and its upstream cools. So does a ghost release of the
	// old ticket (a reconcile, a heartbeat's) that lands before the
	// requeue: the requeue then finds the old permit given back already.
	var r refund
	if TicketFlow(p.t.id) != "" {
		r.correction = -p.t.cost
	}
	if up := p.Upstream(); up != "" && cool >= 0 {
		r.cool, r.coolFor = up, coolFor(cool)
	}
	settled := q.refundFor(p.t.id, r)
	q.forget(p.t)
	cfg := q.cfg.Load()
	rel := q.releaseArgs(p.t.id)
	r.apply(&rel)
	if !time.Now().Before(p.deadline) {
		// Its max wait is over: no wait is left to requeue into. The
		// permit is given back as the requeue would (charged nothing,
		// its upstream cooling), and the request gets the timeout
		// reject, in every store: Redis's call could not run past the
		// deadline, while the local store's, which reads no context,
		// granted it again at once where a permit was free.
		q.release(rel)
		settled()
		return nil, q.reject(ReasonTimeout, p.start, 0, nil)
	}
	t := q.newTicket(false, false, TicketFlow(p.t.id), 0)
	if t == nil {
		q.release(rel)
		settled()
		return nil, q.reject(ReasonShuttingDown, p.start, 0, nil)
	}
	t.seq, t.cost, t.scale, t.tokens, t.asks = p.t.seq, p.t.cost, p.t.scale, tokens, asks(p.req.Tokens, tokens)
	args := RequeueArgs{Old: p.t.id, Seq: p.t.seq, TicketArgs: TicketArgs{ID: t.id, Node: q.node,
		Limits: cfg.limits(), Cost: t.cost, Tokens: t.tokens, Asks: t.asks, Correction: -p.t.cost, Tombstone: q.s.beatOnItsWay(),
		Cool: rel.Cool, CoolFor: rel.CoolFor}}
	actx, cancel := context.WithDeadline(ctx, p.deadline)
	var res AcquireResult
	sent := time.Now()
	err := q.beforeLeave(func() error {
		var err error
		res, err = q.store.Requeue(actx, args)
		return err
	})
	cancel()
	if err == nil || (ctx.Err() == nil && time.Now().Before(callDeadline(ctx, p.deadline))) {
		// A call cut by the request's own end (its client left, its max
		// wait passed while its upstream ran it) is not the store's
		// failure, as in send: counted, two at once would mark a healthy
		// store down, and on_store_error would admit past every permit.
		q.health.record(q.log, err)
	}
	if err == nil || errors.Is(err, errClosed) {
		settled() // landed (or taken out by the leave): the old permit is given back
	}
	if errors.Is(err, errClosed) {
		// The node left while the call was on its way: its leave took
		// out both tickets, whatever the call did.
		t.state.CompareAndSwap(statePending, stateRejected)
		q.forget(t)
		return nil, q.reject(ReasonShuttingDown, p.start, 0, nil)
	}
	if err != nil {
		// It may have run: take the new ticket out, give the old permit
		// back (both idempotent). Where the requeue ran, the old permit
		// is held no more: the release neither corrects nor cools again.
		t.state.CompareAndSwap(statePending, stateCancelled)
		q.forgetUnused(t)
		rel.Tombstone = rel.Tombstone || q.s.beatOnItsWay()
		q.background(func() {
			q.cancelInStore(t, true, true)
			q.inForceNow(&rel) // read before the requeue: a reload may have landed since
			q.release(rel)
			settled()
		})
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		if !time.Now().Before(p.deadline) {
			return nil, q.reject(ReasonTimeout, p.start, 0, err)
		}
		// The store failed: the request waits again as an Acquire's
		// would (on_store_error: the fallback queue, fail open, or
		// refused as store_unavailable), its upstream cooling there too.
		if cool >= 0 {
			q.coolLocal(p.Upstream(), coolFor(cool), true)
		}
		return q.unavailable(ctx, p.req, p.start, p.deadline, err, nil, nil)
	}
	if args.Cool != "" {
		q.s.cooled(args.CoolFor) // the request (and any waiter) runs as it ends
	}
	return q.enqueue(ctx, t, res, answeredInLease(sent, args.Lease), args.Permits, p.req, p.start, p.deadline, nil)
}
