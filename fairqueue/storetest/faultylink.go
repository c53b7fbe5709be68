package storetest

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
)

// The faulty link between a node and its store, for the model-based
// test (model.go).

// fault is what a lossy link does with one store call.
type fault string

const (
	faultPass  fault = "pass"  // the call runs, its answer is returned
	faultTwice fault = "twice" // it runs twice, the second answer is returned (a client retry after a read timeout)
	faultLost  fault = "lost"  // it runs, its answer is lost: the caller sees an error
	faultFail  fault = "fail"  // it does not run: the caller sees an error
)

var (
	errReplyLost   = errors.New("model: reply lost")
	errUnreachable = errors.New("model: store unreachable")
)

type linkState int

const (
	linkHealthy linkState = iota
	linkLossy
	linkDead // the node crashed: nothing passes
)

// faultyLink is a node's link to its store: a fairqueue.Store that
// forwards every call to inner, and the fairqueue.Listener it registers,
// forwarding grants to the node. While lossy, each call meets the next
// fault of its script (cycled) and each grant notification the next
// entry of its lose list. Close always reaches inner: it frees the
// node's resources, not a network call.
type faultyLink struct {
	inner fairqueue.Store
	node  int
	logf  func(format string, args ...any)

	mu     sync.Mutex
	state  linkState
	script []fault
	calls  int
	lose   []bool
	grants int
	h      fairqueue.Listener
}

func (l *faultyLink) isLossy() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.state == linkLossy
}

func (l *faultyLink) makeLossy(script []fault, lose []bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.state != linkDead {
		l.state, l.script, l.lose, l.calls, l.grants = linkLossy, script, lose, 0, 0
	}
}

func (l *faultyLink) makeHealthy() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.state != linkDead {
		l.state = linkHealthy
	}
}

func (l *faultyLink) kill() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.state = linkDead
}

func (l *faultyLink) next(op string) fault {
	l.mu.Lock()
	f, state := faultPass, l.state
	switch state {
	case linkDead:
		f = faultFail
	case linkLossy:
		f = l.script[l.calls%len(l.script)]
		l.calls++
	}
	l.mu.Unlock()
	if state == linkLossy && f != faultPass {
		l.logf("link of node %d: %s %s", l.node, op, f)
	}
	return f
}

// through runs call as the link's next fault says.
func through[R any](l *faultyLink, op string, call func() (R, error)) (R, error) {
	var zero R
	switch l.next(op) {
	case faultTwice:
		_, _ = call()
	case faultLost:
		if _, err := call(); err != nil {
			return zero, err
		}
		return zero, fmt.Errorf("%s: %w", op, errReplyLost)
	case faultFail:
		return zero, fmt.Errorf("%s: %w", op, errUnreachable)
	}
	return call()
}

func noValue(f func() error) func() (struct{}, error) {
	return func() (struct{}, error) { return struct{}{}, f() }
}

// Open implements fairqueue.Store. A failed subscription is closed by its
// store, so Open either runs or fails: it is never run twice or without
// its reply.
func (l *faultyLink) Open(ctx context.Context, node string, h fairqueue.Listener) error {
	l.mu.Lock()
	l.h = h
	l.mu.Unlock()
	if f := l.next("open"); f == faultFail || f == faultLost {
		return fmt.Errorf("open: %w", errUnreachable)
	}
	return l.inner.Open(ctx, node, l)
}

// Acquire implements fairqueue.Store.
func (l *faultyLink) Acquire(ctx context.Context, t fairqueue.TicketArgs) (fairqueue.AcquireResult, error) {
	return through(l, "acquire "+t.ID, func() (fairqueue.AcquireResult, error) { return l.inner.Acquire(ctx, t) })
}

// Release implements fairqueue.Store.
func (l *faultyLink) Release(ctx context.Context, t fairqueue.TicketArgs) error {
	_, err := through(l, "release "+t.ID, noValue(func() error { return l.inner.Release(ctx, t) }))
	return err
}

// Cancel implements fairqueue.Store.
func (l *faultyLink) Cancel(ctx context.Context, t fairqueue.TicketArgs) error {
	_, err := through(l, "cancel "+t.ID, noValue(func() error { return l.inner.Cancel(ctx, t) }))
	return err
}

// Requeue implements fairqueue.Store.
func (l *faultyLink) Requeue(ctx context.Context, t fairqueue.RequeueArgs) (fairqueue.AcquireResult, error) {
	return through(l, "requeue "+t.Old+" as "+t.ID, func() (fairqueue.AcquireResult, error) { return l.inner.Requeue(ctx, t) })
}

// Transfer implements fairqueue.Transferrer when the store does (the
// local handoff; a store without it never names a head, see Heads).
func (l *faultyLink) Transfer(ctx context.Context, t fairqueue.TicketArgs, to string) error {
	tr, ok := l.inner.(fairqueue.Transferrer)
	if !ok {
		return errors.New("storetest: the store does not transfer")
	}
	_, err := through(l, "transfer "+t.ID+" to "+to, noValue(func() error { return tr.Transfer(ctx, t, to) }))
	return err
}

// Heartbeat implements fairqueue.Store.
func (l *faultyLink) Heartbeat(ctx context.Context, hb fairqueue.HeartbeatArgs) (fairqueue.HeartbeatResult, error) {
	return through(l, "heartbeat", func() (fairqueue.HeartbeatResult, error) { return l.inner.Heartbeat(ctx, hb) })
}

// Reconcile implements fairqueue.Store.
func (l *faultyLink) Reconcile(ctx context.Context, node string, limits fairqueue.Limits) (fairqueue.ReconcileResult, error) {
	return through(l, "reconcile", func() (fairqueue.ReconcileResult, error) { return l.inner.Reconcile(ctx, node, limits) })
}

// Leave implements fairqueue.Store.
func (l *faultyLink) Leave(ctx context.Context, node string, limits fairqueue.Limits) error {
	_, err := through(l, "leave", noValue(func() error { return l.inner.Leave(ctx, node, limits) }))
	return err
}

// Close implements fairqueue.Store.
func (l *faultyLink) Close() error { return l.inner.Close() }

// Granted implements fairqueue.Listener: a lossy link loses the
// notifications its lose list says, a dead one all of them. Grants a
// store returns in a call's reply pass here too (the Redis store hands
// them to the Listener): losing one is found by reconcile as well.
func (l *faultyLink) Granted(grants ...fairqueue.Grant) {
	keep := make([]fairqueue.Grant, 0, len(grants))
	var lost []string
	l.mu.Lock()
	h, state := l.h, l.state
	for _, g := range grants {
		switch {
		case state == linkDead:
		case state == linkLossy && l.lose[l.grants%len(l.lose)]:
			l.grants++
			lost = append(lost, g.Ticket)
		default:
			if state == linkLossy {
				l.grants++
			}
			keep = append(keep, g)
		}
	}
	l.mu.Unlock()
	if len(lost) > 0 {
		l.logf("link of node %d: grant notification lost: %v", l.node, lost)
	}
	if len(keep) > 0 && h != nil {
		h.Granted(keep...)
	}
}

// Heads implements fairqueue.HeadListener: a lossy link loses them when
// it loses the next grant notification, a dead one always.
func (l *faultyLink) Heads(tickets []string, permits int, sent time.Time) {
	l.mu.Lock()
	hh, _ := l.h.(fairqueue.HeadListener)
	lose := l.state == linkDead || (l.state == linkLossy && len(l.lose) > 0 && l.lose[l.grants%len(l.lose)])
	l.mu.Unlock()
	if lose {
		l.logf("link of node %d: heads %q lost", l.node, tickets)
		return
	}
	if hh != nil {
		hh.Heads(tickets, permits, sent)
	}
}

// Resynced implements fairqueue.Listener.
func (l *faultyLink) Resynced() {
	l.mu.Lock()
	h, dead := l.h, l.state == linkDead
	l.mu.Unlock()
	if h != nil && !dead {
		h.Resynced()
	}
}

var (
	_ fairqueue.Store        = (*faultyLink)(nil)
	_ fairqueue.Listener     = (*faultyLink)(nil)
	_ fairqueue.Transferrer  = (*faultyLink)(nil)
	_ fairqueue.HeadListener = (*faultyLink)(nil)
)
