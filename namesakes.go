package caddyfairqueue

import (
	"errors"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
)

// A reload that moves a queue to another store (the local store to
// Redis, another Redis, another key prefix or db) leaves two queues of
// one name on this node for a while: the old config's, retired, with the
// old config's requests still running (and waiting) in the old store,
// and the new config's in the new one. Neither store sees the other's
// requests; together they would run up to twice the permits. So the old
// queue grants nothing more once a handler of the new config has used
// the new one (and so recorded the route its grants take): its waiters
// move into the new queue (at its tail, their max_wait still counted
// from their arrival), and so does a request of the old config that
// reaches it after the reload; the new queue counts the old one's
// running requests against its permits, and against each upstream's,
// until they end. Apart from a grant made as the waiters move, that
// count only falls. Two live queues of one name in different stores
// (two sites of one config) are apart by the operator's choice and do
// not count each other. The count is this instance's: in a cluster that
// changes store, each instance counts its own old requests.

// errMoved: the queue a request waited in moved to another store, and
// the new one is gone too (another reload).
var errMoved = errors.New("the queue moved to another store")

// namesakes are the engines of this process by queue name.
var namesakes = engineRegistry{byName: make(map[string][]*engine)}

type engineRegistry struct {
	mu     sync.Mutex
	byName map[string][]*engine
	// retired counts the retired engines listed, so that reserved costs
	// nothing while there are none (the common case).
	retired atomic.Int64
}

func (r *engineRegistry) add(e *engine) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.byName[e.name] = append(r.byName[e.name], e)
}

// remove takes e out; last reports whether no engine of its name is
// left.
func (r *engineRegistry) remove(e *engine) (last bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !slices.Contains(r.byName[e.name], e) {
		return false
	}
	if e.retiredFlag.Load() {
		r.retired.Add(-1)
	}
	rest := slices.DeleteFunc(r.byName[e.name], func(o *engine) bool { return o == e })
	if len(rest) == 0 {
		delete(r.byName, e.name)
		return true
	}
	r.byName[e.name] = rest
	return false
}

// reserved is fairqueue.Config.Reserved of e's queue: the requests
// still running in the retired namesakes of a live queue (see above).
func (e *engine) reserved() int {
	return e.retiredSum(func(o *engine) int64 { return o.running.Load() })
}

// reservedTokens is fairqueue.Config.ReservedTokens of e's queue: the
// KV-cache tokens of those same requests.
func (e *engine) reservedTokens() int {
	return e.retiredSum(func(o *engine) int64 { return o.tokens.Load() })
}

// retiredSum adds what count reads of each retired namesake of e in
// another store; 0 for a retired e.
func (e *engine) retiredSum(count func(*engine) int64) int {
	if e.retiredFlag.Load() || namesakes.retired.Load() == 0 {
		return 0 // retired, it grants nothing more: its waiters moved
	}
	namesakes.mu.Lock()
	defer namesakes.mu.Unlock()
	var n int64
	for _, o := range namesakes.byName[e.name] {
		if o.data != e.data && o.retiredFlag.Load() {
			n += count(o)
		}
	}
	return int(n)
}

// successor is the live queue of e's name in another store, the newest,
// if e is retired; nil if none.
func (r *engineRegistry) successor(e *engine) *engine {
	if !e.retiredFlag.Load() {
		return nil
	}
	return r.newestLive(e.name, func(o *engine) bool { return o.data != e.data })
}

// live is the newest live engine of the name, nil if none.
func (r *engineRegistry) live(name string) *engine {
	return r.newestLive(name, func(*engine) bool { return true })
}

// route is the live route of the shape of a live engine of the name,
// the newest; nil if none. The routes are read with the registry
// unlocked: a handler's mu, which they take, comes first.
func (r *engineRegistry) route(name string, pooled bool) *route {
	r.mu.Lock()
	all := slices.Clone(r.byName[name])
	r.mu.Unlock()
	for i := len(all) - 1; i >= 0; i-- {
		if o := all[i]; !o.retiredFlag.Load() {
			if rt, live := o.routes.get(pooled); live {
				return rt
			}
		}
	}
	return nil
}

// newestLive is the newest live engine of the name for which ok holds
// (called under r.mu: it must take no lock), nil if none.
func (r *engineRegistry) newestLive(name string, ok func(*engine) bool) *engine {
	r.mu.Lock()
	defer r.mu.Unlock()
	all := r.byName[name]
	for i := len(all) - 1; i >= 0; i-- {
		if o := all[i]; !o.retiredFlag.Load() && ok(o) {
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

// move sends the waiters of e's queue, now and from now on, to its
// successor: the queue answers them ErrShuttingDown, which acquire reads
// as "moved" while e.moved is set.
func (e *engine) move() {
	if e.moved.CompareAndSwap(false, true) {
		e.q.RejectWaiters()
	}
}

// acquire waits for a permit of the queue of c.e for the request. If a
// reload moves the queue to another store meanwhile, the request waits
// on in the new queue: c.e and c.done then name that queue's engine and
// the exit from both.
func (c *call) acquire() (*fairqueue.Permit, error) {
	req := c.req
	maxWait := time.Duration(c.h.MaxWait)
	if req.MaxWait > 0 && req.MaxWait < maxWait {
		maxWait = req.MaxWait
	}
	for {
		p, err := c.e.q.Acquire(c.r.Context(), req)
		if err == nil || !c.e.moved.Load() || !errors.Is(err, fairqueue.ErrShuttingDown) {
			return p, err
		}
		next := namesakes.successor(c.e)
		if next == nil {
			// Moved, and its successor gone since (another reload).
			return nil, &fairqueue.RejectError{Reason: fairqueue.ReasonShuttingDown, Waited: time.Since(c.start), RetryAfter: time.Second, Err: errMoved}
		}
		next.enter()
		prev := c.done
		c.done = func() { next.exit(); prev() }
		c.e = next
		req.MaxWait = max(maxWait-time.Since(c.start), time.Millisecond)
	}
}
