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
	q.health.ok(q.log) // the store answered: a down mark from failed opens ends
	q.log.Info("node joined queue", zap.Int("permits", cfg.Permits))
	go q.loop()
	return nil
}

// loop is the node's one background goroutine: per poll interval (or
// Lease/3, if shorter) one reconcile while it has waiters (or while the
// store is down, as a probe), per Lease/3 one heartbeat while it has
// waiters or holders. An idle node sends nothing.
func (q *Queue) loop() {
	defer close(q.loopDone)
	// A tick at least every Lease/3 too: a heartbeat is due then, and a
	// node is alive only while its heartbeats are on time.
	period := func(c *Config) time.Duration { return min(c.PollInterval, c.Lease/3) }
	tick := period(q.cfg.Load())
	ticker := time.NewTicker(tick)
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
		if p := period(cfg); p != tick {
			tick = p
			ticker.Reset(tick)
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
		if q.sweep.Swap(false) {
			sweepUntil = time.Now().Add(cfg.Lease / 3) // a failed transfer may leave a ghost
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
		q.doubt()
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
			q.releaseID(id, 0)
		case t.state.Load() == statePending:
			if c := q.log.Check(zapcore.DebugLevel, "grant found by reconcile"); c != nil {
				c.Write(zap.String("ticket", id))
			}
			q.grant(t, 0, res.Upstreams[id])
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
