package caddyfairqueue

import (
	"context"
	"errors"
	"net/http"
	"reflect"
	"slices"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp/reverseproxy"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
)

// reasonUnreachable is the requeue reason of an upstream that could not
// be reached: reverse_proxy's dial failed or timed out (its DialError).
const reasonUnreachable = "unreachable"

// attempt is what one forwarding of a granted request to next produced.
type attempt struct {
	status int         // the upstream's final status; 0 if none was written
	header http.Header // the upstream's response header, never sent when held
	wrote  bool        // something of the answer reached the client
	held   bool        // the answer is a requeue_on status kept from the client
	err    error       // next's
	relay  *committedWriter
	// late: the answer was still held when the request's max_wait
	// passed, and heldBound cut it (see there).
	late bool
	// stale: it went out on a kept-alive connection on which the
	// upstream answered nothing (connTrace.stale).
	stale bool
}

// refusal is an upstream's failure of a request: the upstream cools,
// and the request is requeued when it may be sent again.
type refusal struct {
	reason string        // the status code, reasonUnreachable, reasonStale or reasonFailed
	cool   time.Duration // how long the upstream is left out of dispatch; < 0: it does not cool
	// resend: the upstream cannot have run the request (a requeue_on
	// answer, or no connection), so it may be sent again.
	resend bool
}

// reasonFailed is the cooldown reason of an upstream that timed out or
// broke its answer after it had the request (reverse_proxy's 502 or 504
// past the dial): it cools, but the request is not sent again, as it may
// have run.
const reasonFailed = "failed"

// refused tells whether a's upstream refused or failed the request: a
// requeue_on status (held back, or passed on when no requeue is left),
// no connection (reverse_proxy's DialError: refused, or a dial timeout),
// a kept-alive connection it had dropped (a 502 before it answered
// anything on it: sent again, the upstream not cooled, as it failed
// nothing it read), or a 502 / 504 past the dial. nil: its answer
// stands.
func (h *Handler) refused(a attempt) *refusal {
	if slices.Contains(h.RequeueOn, a.status) {
		cool := retryAfter(a.header.Get("Retry-After"), time.Now())
		if cool <= 0 {
			cool = h.upstreamCooldown()
		}
		return &refusal{reason: strconv.Itoa(a.status), cool: min(cool, fairqueue.MaxCooldown), resend: true}
	}
	if a.err == nil || a.wrote {
		return nil
	}
	he, ok := errors.AsType[caddyhttp.HandlerError](a.err)
	if !ok || (he.StatusCode != http.StatusBadGateway && he.StatusCode != http.StatusGatewayTimeout) {
		return nil
	}
	if _, dial := errors.AsType[reverseproxy.DialError](a.err); dial {
		return &refusal{reason: reasonUnreachable, cool: h.upstreamCooldown(), resend: true}
	}
	if a.stale && he.StatusCode == http.StatusBadGateway {
		return &refusal{reason: reasonStale, cool: -1, resend: true}
	}
	return &refusal{reason: reasonFailed, cool: h.upstreamCooldown()}
}

// unseen reports whether nothing of a's answer reached the client, so
// that the request can be sent again.
func (a attempt) unseen() bool { return !a.wrote && (a.held || a.err != nil) }

// retryAfter reads a Retry-After value, seconds or an HTTP date; 0 when
// it is absent or unreadable.
func retryAfter(v string, now time.Time) time.Duration {
	if v == "" {
		return 0
	}
	if s, err := strconv.Atoi(v); err == nil {
		if s <= 0 {
			return 0
		}
		return time.Duration(min(s, int(fairqueue.MaxCooldown/time.Second))) * time.Second
	}
	if t, err := http.ParseTime(v); err == nil {
		return t.Sub(now)
	}
	return 0
}

// forward calls next for a request granted on an upstream of the pool.
// hold: a requeue_on answer may be held back (a requeue is left); else
// it is passed on like any other. On a committed stream next writes to a
// committedWriter (see relay).
func (c *call) forward(hold bool) attempt {
	b := c.boundHeld(hold)
	if c.committed {
		cw := &committedWriter{w: c.w, header: make(http.Header)}
		if b != nil {
			cw.onStatus = func(code int) {
				if slices.Contains(c.h.RequeueOn, code) {
					b.hold()
				}
			}
		}
		held := func() bool { return hold && slices.Contains(c.h.RequeueOn, cw.status) }
		err := nextHeld(func() error { return c.nextUnencoded(cw) }, held)
		return attempt{status: cw.status, header: cw.header, wrote: cw.wrote, err: err, relay: cw, held: held(), late: b.stop()}
	}
	hw := &holdWriter{w: c.w, header: c.w.Header().Clone()}
	if hold {
		hw.statuses = c.h.RequeueOn
	}
	if b != nil {
		hw.onHold = b.hold
	}
	err := nextHeld(func() error { return c.runNext(hw) }, func() bool { return hw.held })
	return attempt{status: hw.status, header: hw.header, wrote: hw.wrote, held: hw.held, err: err, late: b.stop()}
}

// heldBound bounds a forwarding whose answer may be held back by the
// request's max_wait: a requeue_on answer is held until its body ends,
// which an upstream that stalls after the header (or sends its body for
// ever) puts off as long as it likes, while the client sees nothing and
// no wait of the queue's runs. Once the answer is held and the request's
// wait has ended, whichever comes last, the forwarding is cut: its
// requeue could not wait any more, and the client gets the timeout
// reject (refusedLate).
type heldBound struct {
	c     *call
	end   time.Time
	timer *time.Timer
	held  atomic.Bool // the answer is held (next's goroutine)
	// state: boundOpen until fire cuts the forwarding (boundCut) or stop
	// ends the bound (boundStopped), whichever comes first: a timer that
	// fired as next returned, its function run after stop, cuts nothing
	// (a cut then would end the request's context, which its requeue and
	// next forwarding go on with, as if its client had left).
	state atomic.Int32
}

// The states of a heldBound.
const (
	boundOpen int32 = iota
	boundCut
	boundStopped
)

// boundHeld starts the bound of a forwarding whose answer may be held
// (hold); nil where none applies (nothing is held, or the permit has no
// wait to end).
func (c *call) boundHeld(hold bool) *heldBound {
	end := c.permit.Deadline()
	if !hold || end.IsZero() || c.cut == nil {
		return nil
	}
	b := &heldBound{c: c, end: end}
	b.timer = time.AfterFunc(time.Until(end), b.fire)
	return b
}

// hold notes that the answer is held back: past the end of the wait,
// it is cut at once.
func (b *heldBound) hold() {
	b.held.Store(true)
	if !time.Now().Before(b.end) {
		b.fire()
	}
}

// fire cuts the forwarding, once, where its answer is held and the
// bound was not stopped.
func (b *heldBound) fire() {
	if b.held.Load() && b.state.CompareAndSwap(boundOpen, boundCut) {
		b.c.cut()
	}
}

// stop ends the bound once next has returned, and reports whether it
// cut the forwarding: once it has returned, the bound cuts nothing.
func (b *heldBound) stop() bool {
	if b == nil {
		return false
	}
	b.timer.Stop()
	return !b.state.CompareAndSwap(boundOpen, boundStopped)
}

// refusedLate answers a request whose held refusal (rf) outlasted its
// max_wait (heldBound cut its forwarding): the timeout reject, as the
// requeue its refusal asked for finds no wait left. The permit is given
// back as that requeue gives it (its upstream cools, its grant is not
// charged); the context the requeue runs in is the request's without
// the cut, which ended only the forwarding: the client is still there.
func (c *call) refusedLate(rf *refusal) error {
	c.countRequeue(rf)
	p, err := c.permit.Requeue(context.WithoutCancel(c.r.Context()), rf.cool)
	// Refused by its queue, which a reload moved to another store: a
	// requeue would wait on in the queue in force (requeue), where this
	// one has no wait left.
	moved := err != nil && c.e.moved.Load() && errors.Is(err, fairqueue.ErrShuttingDown)
	if p != nil || moved {
		// Or granted again as the wait ended (the requeue ran just
		// before it, and dispatch granted it at once): nothing is sent.
		// The queue counted a grant, or nothing (engineObserver), not
		// this reject: counted here.
		if p != nil {
			c.h.charge(p, time.Now(), false, nil)
			p.Release()
		}
		metrics.rejects.WithLabelValues(c.name, string(fairqueue.ReasonTimeout)).Inc()
		err = &fairqueue.RejectError{Reason: fairqueue.ReasonTimeout, Waited: time.Since(c.start), RetryAfter: time.Second}
	}
	c.permit, c.aborted = nil, false
	return c.notGranted(err)
}

// nextHeld calls next (serve) and ends the panic with which
// reverse_proxy aborts an answer whose body broke off
// (http.ErrAbortHandler) when that answer is held back (held): nothing
// of it reached the client, so it is the refusal its status says. Any
// other panic, and that of an answer passed on, goes on.
func nextHeld(serve func() error, held func() bool) error {
	defer func() {
		if !held() {
			return // a panic goes on untouched
		}
		if v := recover(); v != nil && v != http.ErrAbortHandler {
			panic(v)
		}
	}()
	return serve()
}

// requeue sends the request back into its queue at its place after its
// upstream refused it (rf), and waits for a new grant; the keepalive,
// when configured, feeds a streaming client meanwhile. The new permit
// (nil when the wait failed) replaces the refused one.
func (c *call) requeue(rf *refusal) error {
	c.countRequeue(rf)
	// The handlers after this one changed the request in place (a
	// rewrite, a header added): it goes to them again as first passed
	// on, and in place, as Caddy's placeholders read it there.
	resetRequest(c.r, c.sent.Clone(c.r.Context()))
	if c.r.GetBody != nil { // the buffered body, sent again unchanged
		c.r.Body, _ = c.r.GetBody()
	}
	ka, ctx := c.startKeepalive()
	c.feed.use(ka)
	// Its body and headers wait again: counted against max_waiting_bytes, whatever
	// the count (the request is in, and its client must not see the
	// refusal), so that new bodies are refused while it waits.
	n := waitingSize(c.r, c.bodyLen)
	holdWaitingAnyway(n)
	defer releaseWaiting(n)
	p, err := c.permit.Requeue(ctx, rf.cool)
	if err != nil && c.e.moved.Load() && errors.Is(err, fairqueue.ErrShuttingDown) {
		// A reload moved the queue to another store (its permit is given
		// back): the request waits on in the queue in force, as the
		// queue's other waiters do, counted there once granted.
		if c.running {
			c.running = false
			c.e.running.Add(-1)
			c.e.tokens.Add(-c.tokens)
		}
		p, err = c.acquire(ctx)
	}
	c.permit, c.granted = p, time.Now()
	committed, abandoned := ka.halt()
	c.committed = committed || c.committed
	c.abandoned = abandoned || c.abandoned
	return err
}

// countRequeue counts a refusal (rf) of the permit's upstream for which
// the request is given back to its queue (requeue, refusedLate): a
// requeue, a cooldown and, for an adaptive queue, a refusal of that
// upstream, which the client never sees (and no stream whose first
// byte never came: observeAnswer). A stale connection (no cooldown) is
// no refusal of the upstream's: a requeue alone; nor is one that could
// not be reached, which is down, not overloaded (observeAnswer:
// unreached).
func (c *call) countRequeue(rf *refusal) {
	up := c.permit.Upstream()
	if c.h.Adaptive != nil && rf.cool >= 0 && rf.reason != reasonUnreachable {
		c.e.q.ObserveRefused(up)
	}
	c.fb.heldBack = true // counted: no first byte waited for until the next forward
	observeRequeue(c.name, up, rf.reason)
	if rf.cool >= 0 {
		observeCooldown(c.name, up)
	}
	if l := c.h.logger.Check(zapcore.DebugLevel, "upstream refused the request; requeued"); l != nil {
		cool := zap.Skip() // a stale connection's: the upstream does not cool
		if rf.cool >= 0 {
			cool = zap.Duration("cooldown", rf.cool)
		}
		l.Write(zap.String("queue", c.name), zap.String("upstream", up), zap.String("reason", rf.reason), cool)
	}
}

// resetRequest sets the exported fields of r to those of fresh, in
// place, but for its Trailer: the transport may still be writing the
// refused sending's body, and reverse_proxy reads the trailers of the
// request it was passed (r) when that body ends, after the upstream may
// have answered. They stay those the client sent (its body was read to
// its end before the first sending). r's context is already fresh's.
func resetRequest(r, fresh *http.Request) {
	dst, src := reflect.ValueOf(r).Elem(), reflect.ValueOf(fresh).Elem()
	for i := range dst.NumField() {
		if f := dst.Type().Field(i); f.IsExported() && f.Name != "Trailer" {
			dst.Field(i).Set(src.Field(i))
		}
	}
}

// cool leaves the permit's upstream out of dispatch after it refused or
// failed the request and the request is not requeued: the answer stands
// (a stale connection's: the upstream does not cool).
func (c *call) cool(rf *refusal) {
	if rf.cool < 0 {
		return
	}
	c.permit.Cool(rf.cool)
	observeCooldown(c.name, c.permit.Upstream())
}
