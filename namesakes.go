package caddyfairqueue

import (
	"context"
	"errors"
	"math"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
)

// A reload that moves a queue to another store (the local store to
// Redis, another Redis, another key prefix or db) leaves two queues of
// one name on this node for a while: the old config's, with the old
// config's requests still running (and waiting) in the old store, and
// the new config's in the new one. Neither store sees the other's
// requests; together they would run up to twice the permits. So each
// counts the other's running requests against its permits, and against
// each upstream's, until they end: Caddy starts the new config before it
// stops the old one, and for that moment both serve. While the other has
// requests waiting in it, a queue grants nothing, unless its own waiters
// began to wait first: the other's store may have granted one of
// them already, and the grant reaches this node (and the running count)
// a moment later. Once the old config
// is cleaned up its queue is retired and grants nothing more once a
// handler of the new config has used the new one (and so recorded the
// route its grants take): its waiters move into the new queue (at its
// tail, their max_wait still counted from their arrival), and so does a
// request of the old config that reaches it after the reload. Apart from
// a grant made as the waiters move, the count then only falls. A retired
// queue still open shares its store with a newer queue of that store (a
// reload back to it, or one that changed only a Redis client option): it
// takes that queue's settings (sameStore, liveSameStore), so that its
// releases hand permits on under the settings in force. Two live
// queues of one name in different stores used by one config (two sites)
// are apart by the operator's choice and do not count each other: a
// queue records the config loads whose live handlers use it, and stays
// apart from the other once one of them moves (namesakes_apart.go). The count
// is this instance's: in a cluster that changes store, each instance
// counts its own old requests.

// errMoved: the queue a request waited in moved to another store, and
// the new one is gone too (another reload).
var errMoved = errors.New("the queue moved to another store")

// namesakes are the engines of this process by queue name.
var namesakes = engineRegistry{byName: make(map[string][]*engine)}

type engineRegistry struct {
	mu     sync.Mutex
	byName map[string][]*engine
	// split counts the names listed with engines in more than one store,
	// so that reserved costs nothing while there are none (the common
	// case).
	split atomic.Int64
}

func (r *engineRegistry) add(e *engine) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.relist(e.name, append(r.byName[e.name], e))
}

// relist sets the engines of name (none: deletes it) and keeps split.
// Under r.mu.
func (r *engineRegistry) relist(name string, all []*engine) {
	r.split.Add(int64(b2i(inStores(all)) - b2i(inStores(r.byName[name]))))
	if len(all) == 0 {
		delete(r.byName, name)
		return
	}
	r.byName[name] = all
}

// inStores reports whether the engines are in more than one store.
func inStores(all []*engine) bool {
	for _, o := range all {
		if o.data != all[0].data {
			return true
		}
	}
	return false
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

// use records that a live handler of the config load (its context's Done
// channel, see claims) holds a reference to e; unuse, that it dropped it.
func (r *engineRegistry) use(e *engine, load <-chan struct{}) {
	if load == nil {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if e.loads == nil {
		e.loads = make(map[<-chan struct{}]int)
	}
	e.loads[load]++
	r.markApart(e, load)
}

func (r *engineRegistry) unuse(e *engine, load <-chan struct{}) {
	if load == nil {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if e.loads[load]--; e.loads[load] <= 0 {
		delete(e.loads, load)
	}
}

// remove takes e out; last reports whether no engine of its name is
// left.
func (r *engineRegistry) remove(e *engine) (last bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !slices.Contains(r.byName[e.name], e) {
		return false
	}
	rest := slices.DeleteFunc(slices.Clone(r.byName[e.name]), func(o *engine) bool { return o == e })
	for _, o := range rest {
		delete(o.apart, e)
	}
	r.relist(e.name, rest)
	return len(rest) == 0
}

// all lists every engine of every name, oldest first within a name.
func (r *engineRegistry) all() []*engine {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []*engine
	for _, es := range r.byName {
		out = append(out, es...)
	}
	return out
}

// reserved is fairqueue.Config.Reserved of e's queue: the requests
// still running in the namesakes of a live queue in other stores that
// its config does not use (see above).
func (e *engine) reserved() int {
	return e.retiredSum(func(o *engine) int64 { return o.running.Load() })
}

// reservedTokens is fairqueue.Config.ReservedTokens of e's queue: the
// KV-cache tokens of those same requests.
func (e *engine) reservedTokens() int {
	return e.retiredSum(func(o *engine) int64 { return o.tokens.Load() })
}

// retiredSum adds what count reads of each namesake of e in another
// store that is retired or that no config using e uses. While such a
// namesake has requests waiting in it, it may grant one at any moment
// (the grant reaches this node a moment after its store made it), so e
// counts everything reserved (allReserved), unless e's own waiters
// began to wait first (waitList: the stretch without a break during
// which some have waited): that one grants nothing meanwhile (it reads
// e's the same way), so of two queues that both have waiters exactly one
// grants, and the turn passes only once the one granting has no waiter
// left, whose grant could still be on its way. A retired e counts them too: its
// releases still hand permits on in its store, where a newer queue of
// its store may wait.
func (e *engine) retiredSum(count func(*engine) int64) int {
	if namesakes.split.Load() == 0 {
		return 0
	}
	mine, waits := e.waits.busy()
	namesakes.mu.Lock()
	defer namesakes.mu.Unlock()
	var n int64
	for _, o := range namesakes.byName[e.name] {
		if o.data != e.data && (o.retiredFlag.Load() || !sharesLoad(e, o)) && !namesakes.keptApart(e, o) {
			// First: a grant leaves the list once counted.
			if theirs, ok := o.waits.busy(); ok && (!waits || theirs < mine) {
				return allReserved
			}
			n += count(o)
		}
	}
	return int(min(n, allReserved))
}

// allReserved is what reserved returns while a namesake may still grant:
// more than any capacity, so the queue grants nothing.
const allReserved = math.MaxInt32

// sharesLoad reports whether a config load uses both a and b. Under
// namesakes.mu.
func sharesLoad(a, b *engine) bool {
	for l := range a.loads {
		if b.loads[l] > 0 {
			return true
		}
	}
	return false
}

// sameStore lists the retired engines of e's name and store still open:
// the queue of an old config that used the store, then a config that did
// not, while its last requests run; a reload back to the store opened e
// beside it.
func (r *engineRegistry) sameStore(e *engine) []*engine {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []*engine
	for _, o := range r.byName[e.name] {
		if o != e && o.data == e.data && o.retiredFlag.Load() {
			out = append(out, o)
		}
	}
	return out
}

// liveSameStore is the newest live engine of e's name and data whose
// handler has applied its settings (its route is known), nil if none.
func (r *engineRegistry) liveSameStore(e *engine) *engine {
	return r.newestLive(e.name, func(o *engine) bool { return o != e && o.data == e.data && o.routes.known() })
}

// successor is the live queue of e's name in another store, the newest,
// if e is retired; nil if none.
func (r *engineRegistry) successor(e *engine) *engine {
	if !e.retiredFlag.Load() {
		return nil
	}
	// Not another site's queue, where e has a namesake that is not (see
	// keptApart).
	other := func(o *engine) bool { return o.data != e.data && !e.apart[o] }
	if r.newestLive(e.name, other) == nil {
		other = func(o *engine) bool { return o.data != e.data }
	}
	// One whose route is known first: a newer one may belong to a config
	// still being loaded (or one that fails to), which serves nothing.
	if s := r.newestLive(e.name, func(o *engine) bool { return other(o) && o.routes.known() }); s != nil {
		return s
	}
	return r.newestLive(e.name, other)
}

// movedFrom is the live queue of name, the newest, in another store than
// that of h, a handler cleaned up since, where the config in force keeps
// the queue there; nil where a config loaded since h's keeps it in h's
// store (a live engine of it that a handler of such a config uses): a
// queue of the name in another store is then another site's, apart by
// the operator's choice.
func (r *engineRegistry) movedFrom(h *Handler, name string) *engine {
	data := h.backend.dataID()
	r.mu.Lock()
	defer r.mu.Unlock()
	all := r.byName[name]
	for _, o := range all {
		if o.data != data || o.retiredFlag.Load() {
			continue
		}
		for l, n := range o.loads {
			if l != h.load && n > 0 {
				return nil
			}
		}
	}
	for i := len(all) - 1; i >= 0; i-- {
		if o := all[i]; !o.retiredFlag.Load() && o.data != data {
			return o
		}
	}
	return nil
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

// settingsRoute is the plain route recorded for the handler whose
// settings e's queue has (settingsGen), on e or on another engine of its
// name and data: a retired queue of the same store takes a newer one's
// settings (adopt), whose handler recorded its route there. nil if none.
func (r *engineRegistry) settingsRoute(e *engine) *route {
	gen := e.settingsOf()
	if gen == 0 {
		return nil
	}
	r.mu.Lock()
	all := append([]*engine{e}, r.byName[e.name]...)
	r.mu.Unlock()
	for _, o := range all {
		if rt := o.routes.plain.Load(); o.data == e.data && rt != nil && rt.h.gen == gen {
			return rt
		}
	}
	return nil
}

// lastPlainRoute is the plain route recorded last, by the newest
// handler, on e or on another engine of its name and data (a retired
// queue of the same store takes a newer one's settings: adopt, whose
// handler recorded its route there); nil if none.
func (r *engineRegistry) lastPlainRoute(e *engine) *route {
	r.mu.Lock()
	all := append([]*engine{e}, r.byName[e.name]...)
	r.mu.Unlock()
	var last *route
	for _, o := range all {
		if rt := o.routes.plain.Load(); o.data == e.data && rt != nil && (last == nil || rt.h.gen > last.h.gen) {
			last = rt
		}
	}
	return last
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
		if o.data != e.data && o.retiredFlag.Load() && !r.keptApart(e, o) {
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

// grantArrived runs between a request's grant and its count in its
// engine's running requests; tests use it to hold a grant there.
var grantArrived = func(*engine) {}

// waitIn waits for a permit of e's queue for the request, listed in
// e.waits meanwhile; a granted request is counted in e.running (and its
// tokens in e.tokens) before it leaves e.waits, so that a namesake in
// another store that reads waits, then running, never misses it (see
// retiredSum).
func (c *call) waitIn(ctx context.Context, e *engine, req fairqueue.Request) (*fairqueue.Permit, error) {
	defer e.waits.add(c.h)()
	p, err := e.q.Acquire(ctx, req)
	if err == nil {
		grantArrived(e)
		c.running = true
		e.running.Add(1)
		c.tokens = int64(p.Tokens())
		e.tokens.Add(c.tokens)
	}
	return p, err
}

// movedOut runs as a request leaves a queue a reload moved, before it
// looks for the queue to wait on in; tests use it to hold that moment.
var movedOut = func(*engine) {}

// awaitsRoute runs as a request moved out of c.e starts to wait for the
// live queue of its name to be served (nextQueue); tests use it to see
// that moment.
var awaitsRoute = func(*engine) {}

// nextQueue is the queue a request moved out of c.e waits on in: its
// successor, else, where a reload brought the queue back to c.e's own
// store (c.e moved out, then the config in force opened the store again
// beside it; its successor was retired since), the live queue of its
// name once a handler of it has served (its route is known: until then,
// a grant of its settings, a pool's, would have no route of its shape
// and run on the request's own). nil: no queue of its name in force.
// It waits no longer than the request's max_wait.
func (c *call) nextQueue(ctx context.Context, maxWait time.Duration) (*engine, error) {
	var tick *time.Ticker
	for {
		if next := namesakes.successor(c.e); next != nil {
			return next, nil
		}
		next := namesakes.live(c.e.name)
		if next == nil || next.routes.known() {
			return next, nil
		}
		if time.Since(c.start) >= maxWait {
			metrics.rejects.WithLabelValues(c.name, string(fairqueue.ReasonTimeout)).Inc()
			return nil, &fairqueue.RejectError{Reason: fairqueue.ReasonTimeout, Waited: time.Since(c.start), RetryAfter: time.Second, Err: errMoved}
		}
		if tick == nil {
			awaitsRoute(next)
			tick = time.NewTicker(5 * time.Millisecond)
			defer tick.Stop()
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-tick.C:
		}
	}
}

// acquire waits for a permit of the queue of c.e for the request. If a
// reload moves the queue to another store meanwhile, the request waits
// on in the new queue: c.e and c.done then name that queue's engine and
// the exit from both.
func (c *call) acquire(ctx context.Context) (*fairqueue.Permit, error) {
	req := c.req
	maxWait := time.Duration(c.h.MaxWait)
	if req.MaxWait > 0 && req.MaxWait < maxWait {
		maxWait = req.MaxWait
	}
	for {
		retired, err := c.awaitRoute(ctx, maxWait)
		if err != nil {
			return nil, err
		}
		if !retired {
			p, err := c.waitIn(ctx, c.e, req)
			if err == nil || !c.e.moved.Load() || !errors.Is(err, fairqueue.ErrShuttingDown) {
				return p, err
			}
			movedOut(c.e)
		}
		next, err := c.nextQueue(ctx, maxWait)
		if err != nil {
			return nil, err
		}
		if next == nil {
			// Moved, or retired before it served (awaitRoute), and no
			// queue of its name in force (another reload removed it, or
			// the exit): refused here, and counted here (engineObserver).
			metrics.rejects.WithLabelValues(c.name, string(fairqueue.ReasonShuttingDown)).Inc()
			return nil, &fairqueue.RejectError{Reason: fairqueue.ReasonShuttingDown, Waited: time.Since(c.start), RetryAfter: time.Second, Err: errMoved}
		}
		grace := c.h.abortGrace()
		next.enter(grace)
		prev := c.done
		c.done = func() { next.exit(grace); prev() }
		c.e = next
		req.MaxWait = max(maxWait-time.Since(c.start), time.Millisecond)
	}
}
