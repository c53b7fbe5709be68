package caddyfairqueue

import (
	"context"
	"errors"
	"slices"
	"sync"
	"time"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
)

// A reload that moves a queue to another store (the local store to
// Redis, another Redis, another key prefix or db) leaves two queues of
// one name on this node for a while: the old config's, retired, with the
// old config's requests still running (and waiting) in the old store,
// and the new config's in the new one. Neither store sees the other's
// requests; together they would run up to twice the permits. So the old
// queue grants nothing more once the new one has served a request of the
// new config (and so knows the route its grants take): its waiters move
// into the new queue (at its tail, their max_wait still counted from
// their arrival), and the new
// queue counts the old one's running requests against its permits, and
// against each upstream's, until they end. That count only falls, so the
// new queue never reads it too low. Two live queues of one name in
// different stores (two sites of one config) are apart by the operator's
// choice and do not count each other. The count is this instance's: in
// a cluster that changes store, each instance counts its own old
// requests.

// errMoved ends the wait of a request in a queue that a reload moved to
// another store: it waits on in the new one.
var errMoved = errors.New("the queue moved to another store")

// namesakes are the engines of this process by queue name.
var namesakes = engineRegistry{byName: make(map[string][]*engine)}

type engineRegistry struct {
	mu     sync.Mutex
	byName map[string][]*engine
}

func (r *engineRegistry) add(e *engine) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.byName[e.name] = append(r.byName[e.name], e)
}

func (r *engineRegistry) remove(e *engine) {
	r.mu.Lock()
	defer r.mu.Unlock()
	rest := slices.DeleteFunc(r.byName[e.name], func(o *engine) bool { return o == e })
	if len(rest) == 0 {
		delete(r.byName, e.name)
		return
	}
	r.byName[e.name] = rest
}

// reserved is fairqueue.Config.Reserved of e's queue: the requests
// still running in the retired namesakes of a live queue (see above).
func (e *engine) reserved() int {
	if e.retiredFlag.Load() {
		return 0 // it grants nothing more: its waiters moved
	}
	namesakes.mu.Lock()
	defer namesakes.mu.Unlock()
	n := 0
	for _, o := range namesakes.byName[e.name] {
		if o.data != e.data && o.retiredFlag.Load() {
			n += int(o.running.Load())
		}
	}
	return n
}

// successor is the live queue of e's name in another store, the newest,
// if e is retired; nil if none.
func (r *engineRegistry) successor(e *engine) *engine {
	if !e.retiredFlag.Load() {
		return nil
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	all := r.byName[e.name]
	for i := len(all) - 1; i >= 0; i-- {
		if o := all[i]; o.data != e.data && !o.retiredFlag.Load() {
			return o
		}
	}
	return nil
}

// moveRetired moves the waiters of e's retired namesakes in other stores
// into e, a live queue whose first route was just recorded.
func (r *engineRegistry) moveRetired(e *engine) {
	r.mu.Lock()
	var old []*engine
	for _, o := range r.byName[e.name] {
		if o.data != e.data && o.retiredFlag.Load() {
			old = append(old, o)
		}
	}
	r.mu.Unlock()
	for _, o := range old {
		o.move()
	}
}

// leftover marks e, opened for a request of an old config after the
// reload, as retired: a live namesake in another store counts its
// running requests, and its waiters move there as a retired queue's do.
func (e *engine) leftover() {
	e.retiredFlag.Store(true)
	if s := namesakes.successor(e); s != nil && s.routes.known() {
		e.move()
	}
}

// waitCtx is ctx for a wait in e's queue, ended with errMoved when the
// queue's waiters move (at once if they have); stop must be called when
// the wait is over.
func (e *engine) waitCtx(ctx context.Context) (wctx context.Context, stop func()) {
	wctx, cancel := context.WithCancelCause(ctx)
	key := &cancel
	e.mu.Lock()
	if e.moved {
		e.mu.Unlock()
		cancel(errMoved)
		return wctx, func() {}
	}
	if e.waiters == nil {
		e.waiters = make(map[*context.CancelCauseFunc]struct{})
	}
	e.waiters[key] = struct{}{}
	e.mu.Unlock()
	return wctx, func() {
		e.mu.Lock()
		delete(e.waiters, key)
		e.mu.Unlock()
		cancel(nil)
	}
}

// move ends the waits in e's queue with errMoved, now and from now on.
func (e *engine) move() {
	e.mu.Lock()
	e.moved = true
	ws := e.waiters
	e.waiters = nil
	e.mu.Unlock()
	for cancel := range ws {
		(*cancel)(errMoved)
	}
}

// acquire waits for a permit of *e's queue for a request that arrived at
// start. If a reload moves the queue to another store meanwhile, the
// request waits on in the new queue: *e and *done then name that queue's
// engine and the exit from both.
func (h *Handler) acquire(ctx context.Context, e **engine, done *func(), req fairqueue.Request, start time.Time) (*fairqueue.Permit, error) {
	maxWait := time.Duration(h.MaxWait)
	if req.MaxWait > 0 && req.MaxWait < maxWait {
		maxWait = req.MaxWait
	}
	for {
		wctx, stop := (*e).waitCtx(ctx)
		p, err := (*e).q.Acquire(wctx, req)
		stop()
		if err == nil || ctx.Err() != nil || !errors.Is(context.Cause(wctx), errMoved) {
			return p, err
		}
		next := namesakes.successor(*e)
		if next == nil {
			// Moved, and its successor gone since (another reload).
			return nil, &fairqueue.RejectError{Reason: fairqueue.ReasonShuttingDown, Waited: time.Since(start), RetryAfter: time.Second, Err: errMoved}
		}
		next.enter()
		prev := *done
		*done = func() { next.exit(); prev() }
		*e = next
		req.MaxWait = max(maxWait-time.Since(start), time.Millisecond)
	}
}
