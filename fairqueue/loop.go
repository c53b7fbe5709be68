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
		beat := time.Since(lastBeat) >= cfg.Lease/3 || q.resync.Swap(false) || (up && !wasUp)
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
			pending = append(pending, t)
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
// permits, and puts the node's waiters back in the queue when the store
// forgot the node (data loss, or silence longer than the lease). It
// reports whether the store answered.
func (q *Queue) heartbeat(cfg *Config) (ok bool) {
	pending, held, adopt := q.snapshot()
	args := HeartbeatArgs{Node: q.node, Limits: cfg.limits(), Held: ids(held), Adopt: ids(adopt), Epoch: q.epoch}
	if args.Epoch == "" {
		if s := q.seen.Load(); s != nil {
			args.Epoch = *s
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), cfg.StoreTimeout)
	defer cancel()
	res, err := q.store.Heartbeat(ctx, args)
	if c := q.log.Check(zapcore.DebugLevel, "heartbeat"); c != nil {
		c.Write(zap.Int("held", len(args.Held)), zap.Int("adopt", len(args.Adopt)), zap.Bool("rejoined", res.Rejoined), zap.Error(err))
	}
	q.health.record(q.log, err)
	if err != nil {
		return false
	}
	for _, t := range adopt {
		t.registered.Store(true)
	}
	q.readded(res.Readded, res.Epoch == q.epoch)
	q.cluster.Store(&res.Cluster)
	if q.epoch != "" && res.Epoch != q.epoch {
		q.log.Warn("store lost its data; re-registered this node's permits", zap.Int("held", len(held)))
	}
	q.epoch = res.Epoch
	q.seen.Store(&res.Epoch)
	if res.Rejoined && len(pending) > 0 {
		q.log.Warn("store had forgotten this node; queueing its waiters again", zap.Int("waiting", len(pending)))
		for _, t := range pending {
			actx, cancel := context.WithTimeout(context.Background(), cfg.StoreTimeout)
			r, err := q.store.Acquire(actx, TicketArgs{ID: t.id, Node: q.node, Limits: cfg.limits()})
			cancel()
			if err != nil {
				q.health.record(q.log, err)
				return true // the heartbeat itself was answered
			}
			if r.Granted {
				q.grant(t, r.GrantNo)
			}
		}
	}
	return true
}

// readded handles the held tickets a heartbeat counted again: those the
// node still holds had lost their holder entry (logged when the data set
// is the same: a new one is logged as such); one released while the
// heartbeat was on its way is released again.
func (q *Queue) readded(ids []string, sameEpoch bool) {
	lost := 0
	for _, id := range ids {
		q.mu.Lock()
		t := q.tickets[id]
		q.mu.Unlock()
		if t == nil {
			q.releaseAsync(id)
			continue
		}
		lost++
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
	defer q.mu.Unlock()
	if !q.draining {
		q.draining = true
		close(q.drainCh)
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
	var err error
	if opened {
		close(q.stopCh)
		<-q.loopDone
		cfg := q.cfg.Load()
		ctx, cancel := context.WithTimeout(context.Background(), cfg.StoreTimeout)
		err = q.store.Leave(ctx, q.node, cfg.limits())
		cancel()
		q.log.Info("node left queue", zap.Error(err))
	}
	q.bgMu.Lock() // closed is set: no background call starts after this
	q.bgMu.Unlock()
	q.bg.Wait()
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
