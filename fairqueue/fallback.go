package fairqueue

import (
	"context"
	"errors"
	"slices"
	"time"

	"go.uber.org/zap"
)

// unavailable applies the store-error policy: queue locally, admit
// (fail open) or reject. Local and fail-open permits are unregistered
// tickets that the next successful heartbeat registers (adopts), so the
// shared queue counts them once the store is back.
//
// A request answered by the policy marks the store down at once, however
// few calls failed so far: the store's up/down state (metrics, admin API)
// then agrees with what clients were told, from the first such answer.
//
// A request for the fallback queue enters it in its turn: turn, that of
// a waiter of the store's queue moving there (moveOut), or else one
// behind those still moving (joinExit), but for one whose turn there came
// and still holds its place (exitTurn.held): it goes in at once.
//
// from is the line of the retired fallback queue the request moves back
// from (moveIn), nil for others: sent to the store's queue instead, it
// goes there ahead of the requests behind it in that line, its number
// there not passed until it queues. Sent as a new request, it joined that
// line again behind its own number, and waited for itself until its max
// wait, every request behind it with it.
func (q *Queue) unavailable(ctx context.Context, req Request, start, deadline time.Time, cause error, turn *exitTurn, from *moveLine) (*Permit, error) {
	q.health.outage(q.log, cause)
	cfg := q.cfg.Load()
	if cfg.Fallback != nil {
		if turn == nil && !req.exit.held() {
			turn = q.joinExit()
		}
		if turn != nil {
			defer turn.line.pass(turn.n)
			var err error
			if req, err = q.awaitExit(ctx, turn, req, start, deadline); err != nil {
				return nil, err
			}
			// The settings in force once its turn came: a reload may
			// have landed while it waited (its policy, flow, tokens).
			cfg = q.cfg.Load()
		}
	}
	// A reload took the fallback queue away (fail_open, fail_closed)
	// during the outage, and the store is back: the policy, which answers
	// a store down, does not answer the request. It waits in the store's
	// queue (a moved waiter, or one that waited for its turn, as localQueue
	// sends it there under a policy that keeps one), or, until the
	// heartbeat that has the store count the outage's local permits still
	// running retires the fallback queue (inFallback), in that queue, as
	// under local: granted by the store then, it would run beside them.
	back := cfg.Fallback == nil && errors.Is(cause, errStoreDown) && q.health.up()
	var lq *Queue
	var inner *Permit
	var line *moveLine
	var n uint64
	switch {
	case cfg.Fallback != nil || back:
		req.MaxWait = time.Until(deadline)
		if req.MaxWait <= 0 {
			return nil, q.reject(ReasonTimeout, start, 0, cause)
		}
		if lq = q.localQueue(!errors.Is(cause, errStoreDown)); lq == nil {
			// The node went back to the store while the request waited
			// for its turn (awaitExit), or for the fallback queue that
			// retired since (retireLocal): it waits in the store's queue,
			// which counts every permit of the node again. So does one
			// whose policy a reload changed meanwhile: the store, down,
			// answers it with the new one.
			req.exit.toStore()
			return q.acquire(ctx, req, start, deadline, from)
		}
		line, n = lq.line, lq.line.take()
		// Passed as it leaves the fallback queue, or once it moved.
		defer line.pass(n)
		var err error
		inner, err = lq.Acquire(ctx, req)
		if errors.Is(err, ErrShuttingDown) && !q.isDraining() {
			// The store is back (retireLocal): the request waits in its
			// queue, at the tail, its max wait still counted from start.
			req.exit.toStore()
			return q.moveIn(ctx, line, n, req, start, deadline)
		}
		if errors.Is(err, ErrShuttingDown) && cfg.Observer != nil {
			// The fallback queue leaves its own out (localObserver).
			cfg.Observer.Rejected(ReasonShuttingDown, time.Since(start))
		}
		if err != nil {
			return nil, err
		}
		// The settings in force once served: a reload while it waited
		// may count tokens, more of them, or fair flows, which its
		// ticket weighs once the store counts it (adopted).
		cfg = q.cfg.Load()
	case !cfg.FailOpen:
		return nil, q.reject(ReasonStoreUnavailable, start, 0, cause)
	}
	// Its flow in its ID: adopted, it counts for its tenant too
	// (max_in_flight_per_tenant), as an acquire's grant would have.
	flow := ""
	if cfg.Fair {
		flow = req.flow()
	}
	// Adopted, it weighs its tokens in the store as an acquire would have
	// counted them: uncounted, they would be granted again beside it.
	tokens, _ := cfg.ClampTokens(req.Tokens)
	t, retired := q.localTicket(lq, flow, tokens)
	if retired {
		// The fallback queue was retired since it gave the permit: the
		// heartbeat that adopted its permits did not name this one, and
		// the store's grants run beside it now. It waits there instead.
		inner.Release()
		req.exit.toStore()
		return q.moveIn(ctx, line, n, req, start, deadline)
	}
	if t == nil {
		if inner != nil {
			inner.Release()
		}
		return nil, q.reject(ReasonShuttingDown, start, 0, nil)
	}
	up := q.localUpstream(cfg)
	if inner != nil {
		up = inner.Upstream()
	}
	if up != "" {
		t.upstream.Store(&up) // adopted on it when the store is back
	}
	return &Permit{q: q, t: t, waited: time.Since(start), local: inner, req: req, start: start, deadline: deadline}, nil
}

// moveIn sends to the store's queue the acquire of a request that
// waited in a fallback queue retired since (n: its number in that
// queue's line), once those before it there have passed: the fallback
// queue's waiters join the store's queue in their order. Its max wait
// still counts from start, the wait for its turn included.
func (q *Queue) moveIn(ctx context.Context, line *moveLine, n uint64, req Request, start, deadline time.Time) (*Permit, error) {
	defer line.pass(n)
	switch line.wait(ctx, n, deadline, q.drainCh) {
	case turnCancelled:
		return nil, ctx.Err()
	case turnTimedOut:
		return nil, q.reject(ReasonTimeout, start, 0, nil)
	case turnDrained:
		return nil, q.reject(ReasonShuttingDown, start, 0, nil)
	}
	onQueued := req.OnQueued
	req.OnQueued = func(w Waiting) {
		line.pass(n) // queued (in a fallback queue, if the store failed again): the next one goes
		if onQueued != nil {
			onQueued(w)
		}
	}
	return q.acquire(ctx, req, start, deadline, line)
}

// localTicket makes the unregistered ticket of a permit the fallback
// queue lq gave (nil: fail open), unless lq was retired meanwhile. Made
// and checked under localMu, as retireLocal checks and retires: a local
// permit is either known to the node before the fallback queue retires,
// and so adopted by then, or refused.
func (q *Queue) localTicket(lq *Queue, flow string, tokens int) (t *ticket, retired bool) {
	if lq == nil {
		return q.newTicket(true, false, flow, tokens), false
	}
	q.localMu.Lock()
	defer q.localMu.Unlock()
	if q.local != lq {
		return nil, true
	}
	return q.newTicket(true, true, flow, tokens), false
}

// inFallback reports whether the node still serves from its fallback
// queue: the store may be back, but until the heartbeat that adopts the
// local permits running (retireLocal), Redis does not count them, and a
// grant it made would run beside them. Also where a reload took the
// fallback queue away (fail_open, fail_closed) during the outage: its
// permits run on, uncounted until that heartbeat alike.
func (q *Queue) inFallback() bool {
	q.localMu.Lock()
	defer q.localMu.Unlock()
	return q.local != nil
}

// backToFallback answers a request whose acquire call (ticket t) the
// store answered while the node serves from its fallback queue: a call
// on its way through the outage, that the client's retries carried to
// the store once back. The store does not count the local permits
// running yet, so its grant would run beside them: t leaves the store,
// and the request waits in the fallback queue, then in the store's
// once they are counted (retireLocal). from: as unavailable's.
func (q *Queue) backToFallback(ctx context.Context, t *ticket, req Request, start, deadline time.Time, from *moveLine) (*Permit, error) {
	t.state.CompareAndSwap(statePending, stateCancelled)
	q.forgetUnused(t)
	q.background(func() { q.cancelInStore(t, true, true) })
	return q.unavailable(ctx, req, start, deadline, errStoreDown, nil, from)
}

// localQueue returns the node's fallback queue (in-process, created on
// first use), sized to the configured local permits, or else to this
// node's share of the permits among the live nodes last seen. failed:
// a store call of the caller's just failed. Otherwise none is opened
// while the store is up (nil): the node serves from the store again
// (retireLocal), and a fallback queue opened then, for a request that
// waited for its turn through the return (a move's, awaitExit) or was
// sent there as the last one retired, would run its permits beside the
// store's grants, which count them only from the next heartbeat. Nil
// too where the settings in force have no fallback queue (a reload): the
// request is answered by the policy in force; but where the store is
// back before the heartbeat that counts the permits of the fallback
// queue opened before the reload, that queue, under the reload's
// settings (reloadLocal, unavailable).
//
// It sizes the fallback queue by the settings in force, read under
// q.localMu, as Reconfigure applies them: a caller read its settings
// before its turn to enter (awaitExit) or before a store call that
// failed (Permit.requeue), and a reload since gave the fallback queue
// its own settings, which the caller's would undo until the next
// request came (TestARequestWaitingItsTurnIntoTheFallbackKeepsAReloadsLocalPermits).
func (q *Queue) localQueue(failed bool) *Queue {
	q.localMu.Lock()
	defer q.localMu.Unlock()
	cfg := q.cfg.Load()
	if cfg.Fallback == nil {
		if failed || !q.health.up() {
			return nil
		}
		// The store back, before the heartbeat that counts the fallback
		// queue's permits (unavailable): the requests fail open let in
		// since a reload took the fallback queue away run on the same
		// upstreams, and the store counts them from that heartbeat too.
		// Uncounted, the fallback queue granted beside them.
		q.countFailOpen(cfg)
		return q.local
	}
	if q.local == nil && !failed && q.health.up() {
		return nil
	}
	lc, permits := q.localConfig(cfg)
	if q.local == nil {
		// The store's permits still running count in the fallback queue
		// until they end: they run on the same upstreams.
		lc.running = q.newStoreRunning(cfg)
		q.local, _ = New(q.fallbackStore(cfg), lc)
		q.local.line = newMoveLine()
		for _, end := range q.localCool {
			// A cooldown of an earlier outage (cooledLocal) hands on as
			// it ends too (coolLocal).
			q.local.s.cooled(time.Until(end))
		}
		q.reconfigureRetired(lc)
		q.log.Warn("store unreachable: queueing in this node only", zap.Int("local_permits", permits))
		if q.isDraining() {
			q.local.RejectWaiters()
		}
	} else {
		q.reconfigureLocal(lc)
	}
	return q.local
}

// fallbackStore is the store a new fallback queue opens on (with
// q.localMu held): that of the fallback queues of outages past whose
// permits still run (retired), which counts those permits, also where a
// reload gave another (Config.Fallback): opened on that one, the new
// fallback queue granted its permits beside them. Those fallback queues
// all share it: each opened on it while one before still ran. Once they
// have all left, cfg's.
func (q *Queue) fallbackStore(cfg *Config) Store {
	if n := len(q.retired); n > 0 {
		return q.retired[n-1].store
	}
	return cfg.Fallback
}

// reconfigureLocal gives the fallback queue in use, if any, the
// settings lc (with q.localMu held): a reload applies to the waiters
// already queued there too (a removed upstream gets no new grant).
func (q *Queue) reconfigureLocal(lc Config) {
	if q.local == nil {
		return
	}
	lc.running = q.running.Load()
	if lcur := q.local.Config(); !sameLocal(lcur, lc) {
		_ = q.local.Reconfigure(lc)
	}
	q.reconfigureRetired(lc)
}

// reconfigureRetired gives the fallback queues of outages past whose
// permits still run the settings lc of the fallback queue in use (with
// q.localMu held). They share its store, and a permit of theirs that
// ends hands that store's permits on to its waiters under their own
// limits: under those of an earlier outage, the store's requests
// running at this one's start uncounted (storeRunning) and the node's
// part dealt among the live nodes of then, more waiters would run.
func (q *Queue) reconfigureRetired(lc Config) {
	for _, r := range q.retired {
		if cur := r.Config(); cur.running != lc.running || !sameLocal(cur, lc) {
			_ = r.Reconfigure(lc)
		}
	}
}

// sameLocal reports whether two fallback queues' configs have the same
// settings: the capacity, and every other a reload may change (the
// tenant and queue caps, fair queueing, the intervals). Compared on the
// capacity alone, a reload that lowered max_in_flight_per_tenant and
// nothing else left the fallback queue running a tenant to the old cap.
// A new Config field a reload may change belongs here too.
func sameLocal(a, b Config) bool {
	return a.Permits == b.Permits && a.KVTokens == b.KVTokens && sameUpstreams(a.Upstreams, b.Upstreams) &&
		a.MaxInFlightPerTenant == b.MaxInFlightPerTenant && a.MaxQueue == b.MaxQueue &&
		a.MaxQueuePerTenant == b.MaxQueuePerTenant && a.Fair == b.Fair && a.PriorityFactor == b.PriorityFactor &&
		a.MaxWait == b.MaxWait && a.PollInterval == b.PollInterval && a.Lease == b.Lease &&
		a.StoreTimeout == b.StoreTimeout && a.DownAfter == b.DownAfter && a.Name == b.Name
}

// localConfig is the fallback queue's config for the node's config cfg,
// and its permits.
func (q *Queue) localConfig(cfg *Config) (Config, int) {
	// The capacity in force: the configured one under the learned shares
	// (Adaptive), the queue's without a pool, each upstream's with one.
	base := Limits{Permits: cfg.Permits, Tokens: cfg.KVTokens, Upstreams: cfg.Upstreams}
	nodes, rank := 1, 0
	var view ClusterView // what the live nodes held at the last heartbeat
	if c := q.s.cluster.Load(); c != nil && c.Nodes > 0 {
		nodes, rank, view = c.Nodes, min(max(c.Rank, 0), c.Nodes-1), *c
	}
	permits := cfg.LocalPermits
	if permits <= 0 {
		if m := q.learn.shares.Load(); cfg.Adaptive != nil && m != nil {
			base.Learned = true
			base = base.Scale(*m)
			if len(base.Upstreams) > 0 {
				base.Permits = max(min(base.Permits, poolPermits(base.Upstreams)), 1)
			}
		}
		// What the node held, and the permits (of the last learned
		// capacity under Adaptive) free then dealt to it among the live
		// nodes last seen (deal); at least one (the floor).
		permits = max(deal(base.Permits, view.Holders, 0, view.HeldBy, rank, nodes), 1)
	}
	// The node's settings, but its own permits and no policy of its own:
	// a new Config field applies to the fallback unless cleared here.
	lc := *cfg
	lc.Name += " (local fallback)"
	lc.Permits = permits
	if cfg.KVTokens > 0 {
		// The node's share of the tokens, as of the permits; where tokens
		// alone bound the queue (its permits stand for no bound), of the
		// live nodes: LocalPermits is no share of those permits.
		lc.KVTokens = max(int(int64(max(base.Tokens, 1))*int64(permits)/int64(max(base.Permits, 1))), 1)
		if cfg.Permits >= MaxPermits || cfg.LocalPermits <= 0 {
			// What the node's holders weighed, and the tokens free then
			// dealt to it; at least one (the floor: a ticket weighs at
			// most the fallback queue's tokens, so one runs at a time).
			lc.KVTokens = max(deal(base.Tokens, view.TokensHeld, 0, view.TokensBy, rank, nodes), 1)
		}
	}
	lc.FailOpen, lc.Fallback, lc.LocalPermits, lc.Adaptive = false, nil, 0, nil
	lc.poolPermits, lc.poolTokens = 0, 0 // its share caps it, whatever its upstreams'
	if cfg.Observer != nil {
		lc.Observer = localObserver{cfg.Observer}
	}
	if cfg.LocalPermits > 0 {
		lc.Upstreams = localUpstreams(base.Upstreams, permits, base.Permits)
	} else {
		lc.Upstreams = dealtUpstreams(base.Upstreams, view.OnUpstreams, rank, nodes)
	}
	return lc, permits
}

// localUpstreams scales each upstream's permits (and tokens) to the
// fallback queue's share (local of all), at least 1 each.
func localUpstreams(us []Upstream, local, all int) []Upstream {
	if len(us) == 0 {
		return nil
	}
	out := make([]Upstream, len(us))
	for i, u := range us {
		out[i] = Upstream{Dial: u.Dial, Permits: max(u.Permits*local/max(all, 1), 1)}
		if u.KVTokens > 0 {
			out[i].KVTokens = max(int(int64(u.KVTokens)*int64(local)/int64(max(all, 1))), 1)
		}
	}
	return out
}

// localObserver is the fallback queue's Observer: the node's, less the
// fallback queue's shutting_down rejects. Those end a wait that goes on
// in the store's queue once the store is back (unavailable), which
// refuses nobody; a drain's, which does, the node's queue counts.
type localObserver struct{ Observer }

// Rejected implements Observer.
func (o localObserver) Rejected(r Reason, wait time.Duration) {
	if r != ReasonShuttingDown {
		o.Observer.Rejected(r, wait)
	}
}

func sameUpstreams(a, b []Upstream) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// retireLocal ends the fallback queue of an outage when the store is
// back and this node's permits are counted there again (the heartbeat
// that adopted them has run, and it gave none since): its waiters wait
// on in the store's queue (unavailable), where a permit the fallback
// queue gave them would run beside the store's grants, uncounted there
// until the next heartbeat.
// Its permits still running stay valid, and it leaves once they end; a
// later outage opens a new one on the same fallback store, which counts
// them.
func (q *Queue) retireLocal() {
	q.localMu.Lock()
	old := q.local
	if old == nil {
		q.localMu.Unlock()
		return
	}
	if _, _, adopt := q.snapshot(); len(adopt) > 0 {
		// A local permit given after the snapshot of the heartbeat that
		// ran: the store does not count it yet. The next heartbeat, at
		// the loop's next turn (inFallback), adopts it.
		q.localMu.Unlock()
		return
	}
	q.moving.Store(old.line) // before the new requests see it retired (inFallback)
	q.local = nil
	q.running.Store(nil)
	q.retired = append(q.retired, old)
	q.localMu.Unlock()
	old.RejectWaiters()
	go func() {
		tick := time.NewTicker(20 * time.Millisecond)
		defer tick.Stop()
		for old.count(false) > 0 && !q.closed.Load() {
			<-tick.C
		}
		q.localMu.Lock()
		q.retired = slices.DeleteFunc(q.retired, func(r *Queue) bool { return r == old })
		q.localMu.Unlock()
		_ = old.Close()
	}()
}
