package fairqueue

import (
	"context"
	"errors"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// errClosed is returned by calls on a closed Queue.
var errClosed = errors.New("fair queue: closed")

// retryOpenAfter spaces attempts to open the store while it is down, so a
// burst of requests does not each wait for a dial timeout.
const retryOpenAfter = time.Second

// start opens the store (subscribing this node to its grants) before the
// node's first acquire, so no grant can slip between the two, and starts
// the background loop.
func (q *Queue) start(ctx context.Context) error {
	q.openMu.Lock()
	defer q.openMu.Unlock()
	if q.opened {
		return nil
	}
	if q.closed.Load() {
		return errClosed
	}
	if !q.openFailedAt.IsZero() && time.Since(q.openFailedAt) < retryOpenAfter {
		return q.openErr
	}
	cfg := q.cfg.Load()
	octx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cfg.StoreTimeout)
	defer cancel()
	if err := q.store.Open(octx, q.node, q); err != nil {
		q.openFailedAt, q.openErr = time.Now(), err
		q.health.failed(q.log, err)
		return err
	}
	q.opened = true
	q.log.Info("node joined queue", zap.Int("permits", cfg.Permits))
	go q.loop()
	return nil
}

// loop is the node's one background goroutine: per poll interval one
// reconcile while it has waiters (or while the store is down, as a probe),
// per Lease/3 one heartbeat while it has waiters or holders. An idle node
// sends nothing.
func (q *Queue) loop() {
	defer close(q.loopDone)
	poll := q.cfg.Load().PollInterval
	ticker := time.NewTicker(poll)
	defer ticker.Stop()
	var lastBeat, sweepUntil time.Time
	wasUp := true
	for {
		select {
		case <-q.stopCh:
			return
		case <-q.kick:
		case <-ticker.C:
		}
		cfg := q.cfg.Load()
		if cfg.PollInterval != poll {
			poll = cfg.PollInterval
			ticker.Reset(poll)
		}
		waiting, held := q.census()
		up := q.health.up()
		beat := time.Since(lastBeat) >= cfg.Lease/3 || q.resync.Swap(false) || (up && !wasUp) ||
			(up && q.verify.Load() && waiting > 0)
		if beat && (waiting+held > 0 || !up) {
			if !q.heartbeat(cfg) {
				// Its reply may be lost with tickets it re-added that
				// this node had released: reconcile finds such ghosts.
				sweepUntil = time.Now().Add(cfg.Lease / 3)
			}
			lastBeat = time.Now()
		}
		if waiting > 0 || !up || time.Now().Before(sweepUntil) {
			q.reconcile(cfg)
		}
		wasUp = up
	}
}

func (q *Queue) kickLoop() {
	select {
	case q.kick <- struct{}{}:
	default:
	}
}

// census counts this node's pending and granted tickets.
func (q *Queue) census() (waiting, held int) {
	q.mu.Lock()
	defer q.mu.Unlock()
	for _, t := range q.tickets {
		if t.state.Load() == statePending {
			waiting++
		} else {
			held++
		}
	}
	return waiting, held
}

func (q *Queue) snapshot() (pending, held, adopt []*ticket) {
	q.mu.Lock()
	defer q.mu.Unlock()
	for _, t := range q.tickets {
		switch {
		case t.state.Load() == statePending:
			if t.queued.Load() {
				pending = append(pending, t)
			}
		case t.state.Load() != stateGranted:
		case t.registered.Load():
			held = append(held, t)
		default:
			adopt = append(adopt, t)
		}
	}
	return pending, held, adopt
}

// heartbeat renews this node's liveness and leases, registers fail-open
// permits, and, when the store may have lost this node's waiters (see
// Queue.verify), names them and queues again those it lost. It reports
// whether the store answered.
func (q *Queue) heartbeat(cfg *Config) (ok bool) {
	pending, held, adopt := q.snapshot()
	verify := q.verify.Swap(false)
	q.beats++
	args := HeartbeatArgs{Node: q.node, Limits: cfg.limits(), Held: ids(held), Adopt: ids(adopt), Epoch: q.epoch, Beat: q.beats}
	if verify {
		args.Pending = ids(pending)
	}
	if args.Epoch == "" {
		if s := q.seen.Load(); s != nil {
			args.Epoch = *s
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), cfg.StoreTimeout)
	defer cancel()
	res, err := q.store.Heartbeat(ctx, args)
	if c := q.log.Check(zapcore.DebugLevel, "heartbeat"); c != nil {
		c.Write(zap.Int("held", len(args.Held)), zap.Int("adopt", len(args.Adopt)), zap.Int("pending", len(args.Pending)),
			zap.Bool("rejoined", res.Rejoined), zap.Int("missing", len(res.Missing)), zap.Error(err))
	}
	q.health.record(q.log, err)
	if err == nil {
		for _, t := range adopt {
			t.registered.Store(true)
		}
	}
	// The call may have run (maybe twice: a client retry) and counted
	// again a permit released while it was on its way, which no reply
	// would then report: release again every such permit. Permit.Release
	// forgets the ticket before it reads registered, so one of the two
	// always releases it in the store.
	q.releaseEnded(held)
	q.releaseEnded(adopt)
	if err != nil {
		q.verify.Store(true)
		return false
	}
	q.readded(res.Readded, res.Epoch == q.epoch)
	q.cluster.Store(&res.Cluster)
	if q.epoch != "" && res.Epoch != q.epoch {
		q.log.Warn("store lost its data; re-registered this node's permits", zap.Int("held", len(held)))
	}
	q.epoch = res.Epoch
	q.seen.Store(&res.Epoch)
	if res.Rejoined {
		// Heartbeat again right away: that one counts the permits this
		// node still holds (a forgotten node re-adds nothing: this call
		// might have been one delayed past the node's leave) and names
		// its waiters, unless this one did.
		if !verify {
			q.verify.Store(true)
		}
		q.resync.Store(true)
		q.kickLoop()
	}
	if len(res.Missing) > 0 {
		q.log.Warn("store had lost waiters of this node; queueing them again", zap.Int("waiting", len(res.Missing)))
		q.requeue(cfg, res.Missing)
	}
	return true
}

// releaseEnded releases again, in the background, the tickets of ts
// that ended (were released) since the snapshot.
func (q *Queue) releaseEnded(ts []*ticket) {
	for _, t := range ts {
		q.mu.Lock()
		cur := q.tickets[t.id]
		q.mu.Unlock()
		if cur != t {
			q.releaseAsync(t.id)
		}
	}
}

// requeue queues again waiters the store lost, with their cost. Queue
// caps do not apply: each was admitted once. A waiter that ended while
// its acquire was on its way is cancelled again, since its own cancel
// may have reached the store first.
func (q *Queue) requeue(cfg *Config, lost []string) {
	l := cfg.limits()
	l.MaxQueue, l.MaxQueuePerTenant = 0, 0
	for _, id := range lost {
		q.mu.Lock()
		t := q.tickets[id]
		q.mu.Unlock()
		if t == nil || t.state.Load() != statePending {
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), cfg.StoreTimeout)
		r, err := q.store.Acquire(ctx, TicketArgs{ID: id, Node: q.node, Limits: l, Cost: t.cost})
		cancel()
		q.health.record(q.log, err)
		if err != nil {
			return // verify is set again: the next heartbeat retries
		}
		q.mu.Lock()
		cur := q.tickets[id]
		q.mu.Unlock()
		switch {
		case cur != t:
			q.background(func() { q.cancelInStore(t, false) })
		case r.Granted:
			q.grant(t, r.GrantNo)
		}
	}
}

// readded logs the held tickets a heartbeat counted again that the node
// still holds: they had lost their holder entry (logged when the data set
// is the same: a new one is logged as such).
func (q *Queue) readded(ids []string, sameEpoch bool) {
	lost := 0
	for _, id := range ids {
		q.mu.Lock()
		t := q.tickets[id]
		q.mu.Unlock()
		if t != nil {
			lost++
		}
	}
	if lost > 0 && sameEpoch && q.epoch != "" {
		q.log.Warn("store had dropped permits this node holds (a failover, or a partition longer than the lease); counted them again",
			zap.Int("permits", lost))
	}
}

// reconcile dispatches permits freed by expired leases and matches the
// store's holders of this node with local tickets: a pending ticket found
// there was granted and its message lost; an unknown one is a ghost (its
// ticket ended while its grant or release was in flight) and is released.
func (q *Queue) reconcile(cfg *Config) {
	ctx, cancel := context.WithTimeout(context.Background(), cfg.StoreTimeout)
	defer cancel()
	res, err := q.store.Reconcile(ctx, q.node, cfg.limits())
	q.health.record(q.log, err)
	if err != nil {
		return
	}
	q.observe(res.Grants, res.Epoch)
	if res.Epoch == "" && q.seen.Load() != nil {
		q.resync.Store(true) // the data set is gone: heartbeat at once
		q.kickLoop()
	}
	q.drain.sample(res.Grants, time.Now())
	for _, id := range res.Holders {
		q.mu.Lock()
		t := q.tickets[id]
		q.mu.Unlock()
		switch {
		case t == nil:
			q.releaseID(id)
		case t.state.Load() == statePending:
			if c := q.log.Check(zapcore.DebugLevel, "grant found by reconcile"); c != nil {
				c.Write(zap.String("ticket", id))
			}
			q.grant(t, 0)
		}
	}
}

func ids(ts []*ticket) []string {
	out := make([]string, len(ts))
	for i, t := range ts {
		out[i] = t.id
	}
	return out
}

// Drain stops admitting, answers every waiting Acquire of this node with
// ErrShuttingDown (removing it from the store), waits until every permit
// of this node is released or ctx ends, then leaves the queue: remaining
// permits are released in the store, and the background loop and the
// store's subscription stop. Nothing of this node stays in the store.
func (q *Queue) Drain(ctx context.Context) error {
	q.RejectWaiters()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for q.count(false) > 0 {
		select {
		case <-ctx.Done():
			return q.leave()
		case <-tick.C:
		}
	}
	return q.leave()
}

// RejectWaiters stops admitting and answers every waiting Acquire with
// ErrShuttingDown at once; held permits stay valid. It is the first half
// of Drain, for callers that wait for in-flight work elsewhere.
func (q *Queue) RejectWaiters() {
	q.mu.Lock()
	if !q.draining {
		q.draining = true
		close(q.drainCh)
	}
	q.mu.Unlock()
	// The fallback queue's waiters too (it is created under localMu and
	// checks draining then, so none is missed).
	q.localMu.Lock()
	defer q.localMu.Unlock()
	if q.local != nil {
		q.local.RejectWaiters()
	}
}

// Close is Drain without waiting for held permits: waiters are answered,
// and permits still held are released in the store.
func (q *Queue) Close() error {
	ctx, cancel := context.WithTimeout(context.Background(), q.cfg.Load().StoreTimeout)
	defer cancel()
	q.RejectWaiters()
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for q.count(true) > 0 {
		select {
		case <-ctx.Done():
			return q.leave()
		case <-tick.C:
		}
	}
	return q.leave()
}

func (q *Queue) count(pendingOnly bool) int {
	w, h := q.census()
	if pendingOnly {
		return w
	}
	return w + h
}

func (q *Queue) leave() error {
	if !q.closed.CompareAndSwap(false, true) {
		return nil
	}
	q.openMu.Lock()
	opened := q.opened
	q.openMu.Unlock()
	if opened {
		close(q.stopCh)
		<-q.loopDone
	}
	// Background calls (each bounded by the store timeout) end before the
	// leave: a cancel that ran after the last node's leave deleted the
	// queue's keys would create some again. closed is set: no background
	// call starts after this.
	q.bgMu.Lock()
	q.bgMu.Unlock()
	q.bg.Wait()
	var err error
	if opened {
		cfg := q.cfg.Load()
		ctx, cancel := context.WithTimeout(context.Background(), cfg.StoreTimeout)
		err = q.store.Leave(ctx, q.node, cfg.limits())
		cancel()
		q.log.Info("node left queue", zap.Error(err))
	}
	q.localMu.Lock()
	if q.local != nil {
		_ = q.local.Close()
	}
	q.localMu.Unlock()
	if cerr := q.store.Close(); err == nil {
		err = cerr
	}
	return err
}

// Stats is a node's view of its queue.
type Stats struct {
	// Waiting is the number of this node's tickets waiting.
	Waiting int
	// InFlight is the number of this node's permits held.
	InFlight int
	// StoreUp is the store's up/down state.
	StoreUp bool
	// Grants is the highest grant counter of the queue seen.
	Grants int64
	// Cluster is the whole queue as the store reported it at this node's
	// last heartbeat (zero before the first).
	Cluster ClusterView
}

// Stats returns this node's view of the queue.
func (q *Queue) Stats() Stats {
	w, h := q.census()
	st := Stats{Waiting: w, InFlight: h, StoreUp: q.health.up(), Grants: q.grants.Load()}
	if c := q.cluster.Load(); c != nil {
		st.Cluster = *c
	}
	return st
}
