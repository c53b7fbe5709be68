package fairqueue

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"
)

// Queue is one node's handle on a named queue in a Store. It is safe for
// concurrent use. Create it with New; stop it with Drain or Close.
type Queue struct {
	store Store
	node  string
	log   *zap.Logger
	cfg   atomic.Pointer[Config]

	s  *session // the node's life in the cluster: join, loop, leave
	ho handoffs // the local handoffs' order and their transfers on the way

	mu      sync.Mutex
	tickets map[string]*ticket // pending and granted, until cleaned up
	// refunds are those of tickets forgotten while the call that gives
	// their permits back is on its way (refund.go): ticket id -> the
	// refund a release of the grant made to them carries.
	refunds  sync.Map
	counter  uint64
	draining bool
	drainCh  chan struct{} // closed by Drain: every waiter is rejected
	// ending counts the waits ending without a permit whose cancel has
	// not returned yet: Close and Drain wait for them (count) before the
	// node leaves, so that no cancel lands after the leave.
	ending atomic.Int32
	bg     sync.WaitGroup // background store calls (stray grants, lost acquires)
	bgMu   sync.Mutex     // orders bg.Add before the bg.Wait of leave
	closed atomic.Bool
	// left is closed when the leave that set closed has ended, with
	// leaveErr its error.
	left     chan struct{}
	leaveErr error

	health   health
	rate     grantRate
	grants   atomic.Int64           // highest grant counter seen in the data set grantsOf names
	grantsOf atomic.Pointer[string] // the store's data set (epoch) grants was seen in
	rr       atomic.Uint64          // round robin of fail-open permits over the upstreams
	learn    learner                // Config.Adaptive

	localMu sync.Mutex
	local   *Queue   // fallback queue while the store is down (LocalFallback)
	retired []*Queue // fallback queues of outages past, until their permits end
	// running is what local counts of the node's requests the store
	// granted that still ran when it opened (nil: none, or no local).
	running atomic.Pointer[storeRunning]
	// line, in a fallback queue, orders its waiters as they move into
	// the store's queue once the store is back (moveIn).
	line *moveLine
	// moving is the line of the fallback queue retired last while its
	// waiters move in: a new request queues behind them (joinMovers).
	moving atomic.Pointer[moveLine]
	// exits is closed, and replaced, when the store's waiters move into
	// the fallback queue (storeDown), and exiting is their line there: a
	// request that comes meanwhile waits behind them (joinExit).
	exits   atomic.Pointer[chan struct{}]
	exiting atomic.Pointer[moveLine]
	// entering is the hold of the last move of the store's waiters
	// (holdLocal), for the fallback queue opened next (localMu).
	entering *exitTurn
	// localCool is the cooldowns of coolLocal: upstream -> its end
	// (localMu), for the fallback queues opened within it.
	localCool map[string]time.Time
}

// New returns a Queue for cfg on store. It makes no store call: the node
// joins the queue at its first Acquire. A nil store is an error.
func New(store Store, cfg Config) (*Queue, error) {
	if store == nil {
		return nil, errors.New("fair queue: New needs a store (memstore.New() or redisstore.New(...))")
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	q := &Queue{
		store:   store,
		node:    newNodeID(),
		tickets: make(map[string]*ticket),
		drainCh: make(chan struct{}),
		left:    make(chan struct{}),
	}
	q.s = newSession(q)
	exits := make(chan struct{})
	q.exits.Store(&exits)
	q.health.onDown = q.storeDown
	q.health.onMarkedDown = q.s.wake
	q.health.needs = permissionsNeeded(store)
	q.log = cfg.Logger.With(zap.String("queue", cfg.Name), zap.String("node", q.node))
	q.health.onFail = func(err error) {
		q.s.note(evVerify, false) // the call may have run, or Redis may be failing over
		if o := q.cfg.Load().Observer; o != nil {
			o.StoreError(err)
		}
	}
	q.cfg.Store(&cfg)
	q.health.downAfter.Store(int32(cfg.DownAfter))
	return q, nil
}

// Node returns this Queue's node ID: random per Queue, never reused.
func (q *Queue) Node() string { return q.node }

// Config returns the settings in force.
func (q *Queue) Config() Config { return *q.cfg.Load() }

// Reconfigure replaces the settings (permits, max wait, intervals,
// policy) of a running Queue; later store calls carry the new values.
func (q *Queue) Reconfigure(cfg Config) error {
	if err := cfg.Validate(); err != nil {
		return err
	}
	cfg = cfg.withDefaults()
	old := q.cfg.Swap(&cfg)
	// Read and applied with localMu held, as localQueue does: of two
	// reloads, or a reload and a request, the fallback queue ends with
	// the settings swapped in last.
	q.localMu.Lock()
	if in := q.cfg.Load(); in.Fallback != nil {
		lc, _ := q.localConfig(in)
		q.reconfigureLocal(lc)
	}
	q.localMu.Unlock()
	q.localSet(old, &cfg)
	q.health.downAfter.Store(int32(cfg.DownAfter))
	// Heads read under the old settings (permits, pool, fair, adaptive)
	// go, and so do those of a reply to a call sent before now, which
	// may come after.
	q.ho.mu.Lock()
	q.s.reloaded = int64(time.Since(q.s.base))
	q.s.head.Store(nil)
	q.ho.mu.Unlock()
	if old.Lease != cfg.Lease || !slices.EqualFunc(old.Upstreams, cfg.Upstreams, sameDial) {
		// Held permits carry the old lease's expiry and the store grants
		// this node's waiters with the lease it last heard: renew both
		// now, not at the new interval. A new pool is named now too: the
		// store forgets what it learned of an upstream no node's last
		// heartbeat named.
		q.s.note(evResync, true)
	}
	return nil
}

// sameDial reports whether two pool upstreams have one address.
func sameDial(a, b Upstream) bool { return a.Dial == b.Dial }

// Acquire blocks until the ticket is granted a permit, ctx ends (the
// context's error is returned), or the max wait passes (a *RejectError
// with ReasonTimeout). A store failure gives a *RejectError with
// ReasonStoreUnavailable, or a fail-open Permit when Config.FailOpen is
// set. The caller must Release a returned Permit.
func (q *Queue) Acquire(ctx context.Context, req Request) (*Permit, error) {
	cfg := q.cfg.Load()
	start := time.Now()
	maxWait := cfg.MaxWait
	if req.MaxWait > 0 && req.MaxWait < maxWait {
		maxWait = req.MaxWait
	}
	deadline := start.Add(maxWait)
	if q.isDraining() {
		return nil, q.reject(ReasonShuttingDown, start, 0, nil)
	}
	return q.acquire(ctx, req, start, deadline, nil)
}

// acquire is Acquire through the store, for a request that came at
// start and waits until deadline; from is the line of the fallback queue
// it moves in from (moveIn), nil for a new request.
func (q *Queue) acquire(ctx context.Context, req Request, start, deadline time.Time, from *moveLine) (*Permit, error) {
	cfg := q.cfg.Load()
	if ctx.Err() != nil {
		// The caller left before its call went out (an HTTP/2 stream
		// reset just after its body): nothing to send, nothing to cancel,
		// and no need to join (a new queue's node, its subscription and
		// keys, for nobody). A call sent with the ended context would
		// fail at once and be cancelled in the background with a
		// tombstone: one store call and one mark kept for TombstoneTTL
		// per request, as many as a flood of such streams sends.
		return nil, ctx.Err()
	}
	if err := q.s.join(ctx); err != nil {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return q.unavailable(ctx, req, start, deadline, err, nil, from)
	}
	// The settings in force once joined: the join may have waited (for
	// an open on its way, its round trips), and a reload meanwhile may
	// allow fewer permits, which the acquire below dispatches under.
	cfg = q.cfg.Load()
	if !q.health.up() || q.inFallback() {
		return q.unavailable(ctx, req, start, deadline, errStoreDown, nil, from)
	}
	if l, n := q.joinMovers(from); l != nil {
		return q.moveIn(ctx, l, n, req, start, deadline)
	}
	flow := ""
	if cfg.Fair {
		flow = req.flow()
	}
	t := q.newTicket(false, false, flow, 0)
	if t == nil {
		return nil, q.reject(ReasonShuttingDown, start, 0, nil)
	}
	res, fresh, permits, err := q.send(ctx, t, req, cfg, deadline)
	if errors.Is(err, errClosed) {
		// The node left (Close) while the call was on its way: its
		// leave took out whatever the call did in the store, and a call
		// that reaches the store after the leave (it timed out here)
		// does nothing there while the node's tombstone lives.
		t.state.CompareAndSwap(statePending, stateRejected)
		q.forget(t)
		return nil, q.reject(ReasonShuttingDown, start, 0, nil)
	}
	if err != nil {
		t.state.CompareAndSwap(statePending, stateCancelled)
		// The call may have reached the store: cancel with a tombstone
		// so a retried or late acquire cannot queue the ticket again.
		// The store is likely in trouble: the answer does not wait.
		q.forgetUnused(t)
		q.background(func() { q.cancelInStore(t, true, true) })
		// go-redis turns a context deadline into a socket deadline, so
		// the call can fail a moment before the context reports it.
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		if d, ok := ctx.Deadline(); ok && !time.Now().Before(d) {
			return nil, context.DeadlineExceeded
		}
		if !time.Now().Before(deadline) {
			return nil, q.reject(ReasonTimeout, start, 0, err)
		}
		return q.unavailable(ctx, req, start, deadline, err, nil, from)
	}
	q.health.ok(q.log)
	if q.inFallback() {
		return q.backToFallback(ctx, t, req, start, deadline, from)
	}
	return q.enqueue(ctx, t, res, fresh, permits, req, start, deadline, from)
}

// enqueue is the one path of a ticket the store answered, from Acquire and
// from Permit.Requeue: the ticket is refused (a queue cap), was cancelled
// before the call ran, is granted at once or joins the queue; then it waits
// for its grant until deadline. fresh: the answer was read less than a lease
// after its call was sent (answeredInLease); a grant in one read later is
// not started before the store confirms it. from: as acquire's.
func (q *Queue) enqueue(ctx context.Context, t *ticket, res AcquireResult, fresh bool, permits int, req Request, start, deadline time.Time, from *moveLine) (*Permit, error) {
	q.observe(res.Grants, res.Epoch)
	if res.Full {
		t.state.CompareAndSwap(statePending, stateRejected)
		q.forget(t) // the store did not queue it
		return nil, q.reject(ReasonQueueFull, start, res.Position, nil)
	}
	if res.Gone {
		t.state.CompareAndSwap(statePending, stateCancelled)
		q.cleanup(t, false)
		return nil, errors.New("fair queue: ticket cancelled before it was queued")
	}
	if t.seq == 0 { // a requeued ticket keeps its place's order
		t.seq = res.Seq
	}
	t.position = res.Position
	if res.Granted && fresh {
		q.grant(t, res.GrantNo, res.Upstream, permits)
	} else {
		if res.Granted {
			q.s.lateGrant(t) // its place unknown: none to show
		} else {
			// Its live place, for its keepalive: a ticket granted at
			// once has none to show (the fast path allocates none).
			q.place(t, res.Position, res.Grants)
			t.queued.Store(true)
			if q.missedMove(t) {
				return q.unavailable(ctx, req, start, deadline, errStoreDown, nil, from)
			}
		}
		if q.cfg.Load().Adaptive != nil {
			q.learn.limited.Store(true)
		}
		if req.OnQueued != nil {
			req.OnQueued(Waiting{q: q, t: t})
		}
	}
	p, err := q.wait(ctx, t, start, deadline)
	if err == errMovedOut {
		return q.moveOut(ctx, t, req, start, deadline, from)
	}
	if err == errGrantInFallback {
		// Its permit given back (served): it waits in the fallback queue.
		return q.unavailable(ctx, req, start, deadline, errStoreDown, nil, from)
	}
	if p != nil {
		p.req, p.deadline = req, deadline
		return p.reweigh(ctx)
	}
	return p, err
}

// wait settles the race between a grant and the end of the wait with one
// compare-and-set on the ticket state, as x/sync/semaphore does: whoever
// moves the ticket out of pending first decides its fate.
func (q *Queue) wait(ctx context.Context, t *ticket, start, deadline time.Time) (*Permit, error) {
	if ctx.Err() == nil {
		select {
		case <-t.granted: // granted at once: no timer needed
			return q.served(t, start)
		default:
		}
	}
	timer := time.NewTimer(time.Until(deadline))
	defer timer.Stop()
	var end int32
	for end == statePending {
		exits := q.exits.Load() // before the state: a move after this closes it
		if t.state.Load() == stateMoved {
			return nil, errMovedOut // its request waits in the fallback queue
		}
		select {
		case <-t.granted:
			if ctx.Err() != nil {
				// Granted as its client left (select picks either): the
				// permit goes to the next waiter, not to nobody.
				q.giveBack(t)
				return nil, ctx.Err()
			}
			return q.served(t, start)
		case <-*exits:
		case <-ctx.Done():
			end = stateCancelled
		case <-timer.C:
			end = stateTimedOut
		case <-q.drainCh:
			end = stateRejected
		}
	}
	q.ending.Add(1) // before the ticket leaves pending: count sees it throughout
	if !t.state.CompareAndSwap(statePending, end) {
		q.ending.Add(-1)
		if t.state.Load() == stateMoved {
			return nil, errMovedOut // its move answers the client's end
		}
		// Granted at the same moment. A client that is gone gives the
		// permit back; a timeout or drain that lost the race is served.
		<-t.granted
		if end != stateCancelled {
			return q.served(t, start)
		}
		q.giveBack(t)
		return nil, ctx.Err()
	}
	pos := q.position(t)
	q.cleanup(t, false)
	q.ending.Add(-1)
	switch end {
	case stateCancelled:
		return nil, ctx.Err()
	case stateTimedOut:
		return nil, q.reject(ReasonTimeout, start, pos, nil)
	default:
		return nil, q.reject(ReasonShuttingDown, start, pos, nil)
	}
}

// grant moves t to granted if it is still pending. A grant for a ticket
// that already left pending is given back by that ticket's own cleanup
// (its cancel releases what it holds).
func (q *Queue) grant(t *ticket, no int64, upstream string, permits int) {
	if no != 0 {
		t.grantNo.CompareAndSwap(0, no)
	}
	if upstream != "" {
		t.upstream.CompareAndSwap(nil, &upstream)
	}
	if t.state.CompareAndSwap(statePending, stateGranted) {
		t.grantPermits.Store(int64(permits))
		t.woken.Store(time.Now().UnixNano())
		t.registered.Store(true)
		close(t.granted)
	}
}

func (q *Queue) reject(r Reason, start time.Time, pos int, cause error) error {
	cfg := q.cfg.Load()
	waited := time.Since(start)
	if cfg.Observer != nil {
		cfg.Observer.Rejected(r, waited)
	}
	return &RejectError{Reason: r, Waited: waited, Position: pos,
		RetryAfter: q.rate.retryAfter(pos, cfg.MaxWait), Err: cause}
}

// permit hands a granted ticket to its caller.
func (q *Queue) permit(t *ticket, start time.Time) *Permit {
	p := &Permit{q: q, t: t, waited: time.Since(start), start: start}
	if o := q.cfg.Load().Observer; o != nil {
		o.Granted(p.waited, t.position > 0)
	}
	return p
}

// newTicket mints and registers a ticket before any store call names it,
// so a grant can never arrive for a ticket the node does not know. A
// fail-open ticket is born granted and unregistered in the store, with
// its tokens: the next heartbeat may name it at once (adopt).
func (q *Queue) newTicket(failOpen, local bool, flow string, tokens int) *ticket {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.draining {
		return nil
	}
	q.counter++
	id := TicketID{Node: q.node, Counter: q.counter, Flow: flow}.String()
	t := &ticket{id: id, no: q.counter, granted: make(chan struct{}), failOpen: failOpen, local: local, tokens: tokens}
	if failOpen {
		t.state.Store(stateGranted)
		close(t.granted)
	}
	q.tickets[t.id] = t
	return t
}

// lookup returns the node's ticket id, nil if it has none.
func (q *Queue) lookup(id string) *ticket {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.tickets[id]
}

// census counts this node's pending and granted tickets.
func (q *Queue) census() (waiting, held int) {
	waiting, held, _ = q.censusAdopt()
	return waiting, held
}

// censusAdopt is census, and counts too the permits given while the
// store was unreachable (fail open, the fallback queue's) that no
// heartbeat has adopted yet (the store does not count them).
func (q *Queue) censusAdopt() (waiting, held, unadopted int) {
	q.mu.Lock()
	defer q.mu.Unlock()
	for _, t := range q.tickets {
		if t.state.Load() == statePending {
			waiting++
			continue
		}
		held++
		if t.failOpen && !t.registered.Load() && t.state.Load() == stateGranted {
			unadopted++
		}
	}
	return waiting, held, unadopted
}

func (q *Queue) forget(t *ticket) {
	q.mu.Lock()
	delete(q.tickets, t.id)
	q.mu.Unlock()
	q.endRunning(t.id)
}

// background runs a store call that nobody waits for; Close waits for it.
func (q *Queue) background(f func()) {
	q.bgMu.Lock()
	defer q.bgMu.Unlock()
	if q.closed.Load() {
		return
	}
	q.bg.Add(1)
	go func() {
		defer q.bg.Done()
		f()
	}()
}

func (q *Queue) isDraining() bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.draining
}

func newNodeID() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}
