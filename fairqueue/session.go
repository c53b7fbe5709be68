package fairqueue

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// errClosed is returned by calls on a closed Queue.
var errClosed = errors.New("fair queue: closed")

// retryOpenAfter spaces attempts to open the store while it is down, so a
// burst of requests does not each wait for a dial timeout.
const retryOpenAfter = time.Second

// probeEvery is the longest the loop waits between two probes of a store
// marked down, whatever the poll interval (health, markDown wakes it).
const probeEvery = time.Second

// session is the node's life in the cluster, as etcd's
// concurrency.Session is a client's: it joins the queue (Store.Open)
// before the node's first acquire, runs the node's one background
// goroutine (heartbeats, reconciles), keeps what the node knows of the
// store's data set (its epoch) and of itself there (alive, with its
// waiters, until when), and leaves. The Queue keeps tickets and waits;
// it tells the session what happened through note and doubt, and the
// session's goroutine alone decides what to send.
type session struct {
	q *Queue

	openMu       sync.Mutex
	opened       bool
	openFailedAt time.Time
	openErr      error
	retrying     bool          // rejoin runs: an open failed
	retryDone    chan struct{} // closed when rejoin has stopped
	// joining is closed when the open on its way after one failed
	// ends (nil: none on its way), failedErr that failed open's error:
	// a request waits for such an open at most joinWait (join).
	joining   atomic.Pointer[chan struct{}]
	failedErr atomic.Pointer[error]

	stop chan struct{} // closed when the loop must stop
	done chan struct{} // closed when the loop has stopped
	kick chan struct{} // wakes the loop before its next tick

	// events are the events noted since the loop last took them.
	events atomic.Uint32

	// The loop's own state, read and written by its goroutine only.
	epoch   string // data-set ID confirmed by the last heartbeat
	beats   uint64 // heartbeats sent
	verify  bool   // evVerify taken and not yet acted on
	resync  bool   // evResync taken and not yet acted on
	sweep   bool   // evSweep taken and not yet acted on
	recheck bool   // evRecheck taken and not yet acted on
	coolEnd bool   // evCoolEnd taken and not yet acted on

	coolEnds coolEnds // the cooldowns the node started, until they end (cooldown_end.go)

	seen    atomic.Pointer[string]      // the last data-set ID any store call saw
	cluster atomic.Pointer[ClusterView] // from the last heartbeat

	// head is the node's waiters the store last said head the queue
	// (Queue.Heads); aliveUntil until when the store surely holds the node
	// alive with its waiters (ns since base on the monotonic clock, which
	// a step of the wall clock does not move: half a lease after the last
	// heartbeat that confirmed both; 0 once anything casts doubt). The
	// release path reads both (Queue.handOn): they are atomics, written
	// by the loop (a confirming heartbeat), by doubt and by the store's
	// replies (the head).
	head       atomic.Pointer[headTickets]
	aliveUntil atomic.Int64
	// reloaded is when the settings last changed (ns since base): heads
	// named by a call sent before were chosen under the old ones
	// (Queue.Heads). Written and read with the queue's ho.mu held.
	reloaded int64
	// confirmed is the last heartbeat that found the node alive with
	// its waiters (or the node's join): a grant read long after it, or
	// made long before it, may be one the store has taken back
	// (Queue.Granted, grantTrusted).
	base      time.Time
	confirmed atomic.Pointer[confirmation]
	// woken counts grants that woke a waiter of this node (Queue.Woken).
	woken atomic.Uint64
	// beating counts the heartbeats on their way (from the snapshot of
	// the permits they name to their reply), and beatDoubt is until when
	// (ns since base) one whose call failed may still reach the store: a permit
	// given back meanwhile is marked (TicketArgs.Tombstone), so that such
	// a heartbeat does not count it again.
	beating   atomic.Int32
	beatDoubt atomic.Int64
}

// beatOnItsWay reports whether a heartbeat that names the node's held
// permits may be on its way to the store.
func (s *session) beatOnItsWay() bool {
	if s.beating.Load() > 0 {
		return true
	}
	d := s.beatDoubt.Load()
	return d != 0 && int64(time.Since(s.base)) < d
}

// An event is something that happened outside the loop that the loop
// acts on at its next turn.
type event uint32

const (
	// evVerify: the store may have lost this node's waiters (a failed
	// call, a new subscription, a rejoin): the next heartbeat names them.
	evVerify event = 1 << iota
	// evResync: the data-set ID, the lease or the pool changed, or a
	// new subscription says a failover may have lost a grant (a running
	// request the store no longer counts): heartbeat at once.
	evResync
	// evSweep: a transfer or release failed (it may run late, or never),
	// or a new subscription says a failover may have lost some, leaving
	// a ghost holder: reconcile for a while.
	evSweep
	// evRecheck: a grant the node could not trust (its answer read a
	// lease after the call, its message maybe older than what is left of
	// its lease): reconcile at once, which starts the waiter if the store
	// still counts the grant, then name every waiter in a heartbeat, which
	// finds it missing if the store took the grant back (maybe that very
	// reconcile: an expired lease is reaped there), and it is queued
	// again. In that order: a heartbeat first would find the expired
	// grant still there, and later heartbeats name only the oldest
	// waiter.
	evRecheck
	// evCoolEnd: a cooldown the node started ended: reconcile at once,
	// which hands on the permits its upstream kept (cooldown_end.go).
	evCoolEnd
)

func newSession(q *Queue) *session {
	return &session{q: q, stop: make(chan struct{}), done: make(chan struct{}), kick: make(chan struct{}, 1), base: time.Now()}
}

// note records e for the loop; with wake, the loop takes it at once
// rather than at its next tick.
func (s *session) note(e event, wake bool) {
	s.events.Or(uint32(e))
	if wake {
		s.wake()
	}
}

func (s *session) wake() {
	select {
	case s.kick <- struct{}{}:
	default:
	}
}

// take folds the events noted so far into the loop's own state. Loop
// only.
func (s *session) take() {
	e := event(s.events.Swap(0))
	s.verify = s.verify || e&evVerify != 0
	s.resync = s.resync || e&evResync != 0
	s.sweep = s.sweep || e&evSweep != 0
	s.recheck = s.recheck || e&evRecheck != 0
	s.coolEnd = s.coolEnd || e&evCoolEnd != 0
}

// takeResync reports and clears a pending resync. Loop only.
func (s *session) takeResync() bool {
	s.take()
	r := s.resync
	s.resync = false
	return r
}

// doubt stops local handoffs until a heartbeat confirms the node and
// its waiters again: the store may have lost them (a new subscription,
// a changed or lost data set), and the head it named may be stale.
func (s *session) doubt() {
	s.aliveUntil.Store(0)
	s.head.Store(nil)
}

// confirmAlive records a heartbeat sent at sent, run by the store at at
// (its clock): if ok (it found the node alive with its waiters), local
// handoffs may go on for half the lease it carried; otherwise they stop
// until one does.
func (s *session) confirmAlive(ok bool, sent, at time.Time, lease time.Duration) {
	if !ok {
		s.doubt()
		return
	}
	s.aliveUntil.Store(int64(sent.Sub(s.base) + lease/2))
	s.confirmed.Store(&confirmation{sent: sent.Sub(s.base), at: at})
}

// confirmation is a heartbeat that found the node alive with its
// waiters: sent, when it was sent (since base, on the monotonic clock,
// which a stopped process's wait counts too); at, when the store ran it
// (the store's clock; zero: unknown, as for the join).
type confirmation struct {
	sent time.Duration
	at   time.Time
}

// grantTrusted reports whether a grant the store made at at (its
// clock; zero: unknown) cannot have been reaped yet: a heartbeat found
// the node alive with its waiters (or it joined) less than a lease ago,
// on the monotonic clock, counting a grant made before that heartbeat
// ran as that much older. Otherwise the node may have been stopped or
// cut off past what was left of the grant's lease (a stop, a starved
// CPU, a partition), its message unread meanwhile: the store may have
// reaped the grant, unrenewed, and given the permit to another. A grant
// is reaped a lease after it was made, at the earliest, so not one made
// after a confirming heartbeat less than a lease ago, nor one made d
// before it while less than a lease - d has passed since; heartbeats,
// every Lease/3, confirm a node in good health well within a lease.
// The two times of the store are from one clock (a failover to a host
// whose clock differs can make a message wait for the reconcile).
func (s *session) grantTrusted(at time.Time, lease time.Duration) bool {
	c := s.confirmed.Load()
	if c == nil {
		return false
	}
	since := time.Since(s.base) - c.sent
	if !at.IsZero() && !c.at.IsZero() && at.Before(c.at) {
		since += c.at.Sub(at) // the grant was that much older
	}
	return since < lease
}

// answeredInLease reports whether the answer of a store call sent at
// sent, read now, may grant a permit: the store writes a grant's lease
// when it runs the call, after sent, so the grant cannot have been
// reaped before a lease after sent (on the monotonic clock, which a
// stopped process's wait counts too). An answer read later (the node
// stopped or starved past its lease with the answer unread) may grant a
// permit the store has since taken back and given to another: the
// ticket waits instead, and the loop asks the store (lateGrant).
func answeredInLease(sent time.Time, lease time.Duration) bool {
	return time.Since(sent) < lease
}

// lateGrant leaves t, granted in an answer read too late to trust
// (answeredInLease), waiting, and has the loop ask the store at once
// (evRecheck): the reconcile starts t if the store still counts its
// grant; otherwise the heartbeat after it, which names every waiter,
// finds it missing and queues it again.
func (s *session) lateGrant(t *ticket) {
	t.queued.Store(true)
	s.q.log.Warn("a grant was read a lease or more after its call (the process stopped or starved?); asking the store before starting it",
		zap.String("ticket", t.id))
	s.note(evRecheck, true)
}

// shared reports whether the node's last heartbeat saw other nodes in
// the queue: with a learned capacity, their reports may have lowered the
// share since the reply that named the node's heads, which the node
// hears of only from its own reports (handOn).
func (s *session) shared() bool {
	c := s.cluster.Load()
	return c != nil && c.Nodes > 1
}

// alive reports whether the store surely holds the node alive with its
// waiters now.
func (s *session) alive() bool {
	return int64(time.Since(s.base)) < s.aliveUntil.Load()
}

// isOpen reports whether the node has joined the queue (and so leaves it,
// cleaning up, when it closes).
func (s *session) isOpen() bool {
	s.openMu.Lock()
	defer s.openMu.Unlock()
	return s.opened
}

// sawEpoch records the data-set ID a store call saw: a change (a restart
// without persistence, a failover) makes the next heartbeat, at once,
// re-assert the node's holders.
func (s *session) sawEpoch(epoch string) {
	if epoch == "" {
		return
	}
	if old := s.seen.Load(); old == nil {
		s.seen.CompareAndSwap(nil, &epoch)
	} else if *old != epoch {
		s.doubt()
		s.note(evResync, true)
	}
}

// leave removes the node from the store: its permits are released.
func (s *session) leave() error {
	q := s.q
	cfg := q.cfg.Load()
	ctx, cancel := context.WithTimeout(context.Background(), cfg.StoreTimeout)
	err := q.store.Leave(ctx, q.node, cfg.limits())
	cancel()
	q.log.Info("node left queue", zap.Error(err))
	return err
}

// loop is the node's one background goroutine: per poll interval (or
// Lease/3, if shorter) one reconcile while it has waiters (or while the
// store is down, as a probe), per Lease/3 one heartbeat. An idle node
// heartbeats too (one call per Lease/3): it stays among the queue's live
// nodes, and its view of the cluster (Stats.Cluster: the operator's
// gauges and admin API) is never older than Lease/3.
func (s *session) loop() {
	q := s.q
	defer close(s.done)
	defer s.coolEnds.stop()
	// A tick at least every Lease/3 too: a heartbeat is due then, and a
	// node is alive only while its heartbeats are on time. Precisely, a
	// heartbeat is due a third of the shortest lease among the one in
	// force and those the last two heartbeats carried: after a reload
	// that lengthens the lease, grants written with the old one while the
	// first heartbeat under the new one was on its way (to waiters it
	// could not name yet) are renewed before the old lease ends.
	var beatLeases [2]time.Duration
	due := func(c *Config) time.Duration {
		d := c.Lease
		for _, l := range beatLeases {
			if l > 0 {
				d = min(d, l)
			}
		}
		return d / 3
	}
	period := func(c *Config) time.Duration {
		p := min(c.PollInterval, due(c))
		if !q.health.up() {
			// While the store reads down the policy answers every
			// request without a call: the probe (reconcile, below) alone
			// finds it back, at least once a second.
			p = min(p, probeEvery)
		}
		return p
	}
	tick := period(q.cfg.Load())
	ticker := time.NewTicker(tick)
	defer ticker.Stop()
	var lastBeat, sweepUntil time.Time
	wasUp := true
	for {
		ticked := false
		select {
		case <-s.stop:
			return
		case <-s.kick:
		case <-ticker.C:
			ticked = true
		}
		cfg := q.cfg.Load()
		if p := period(cfg); p != tick {
			tick = p
			ticker.Reset(tick)
		}
		waiting, _, unadopted := q.censusAdopt()
		up := q.health.up()
		s.take()
		// On a tick, a heartbeat due within half a tick goes now: the
		// ticks are a tick apart, and the one after would be up to a tick
		// late (every 2 x Lease/3 with a tick of Lease/3: leases renewed
		// with a third of one to spare, not two thirds).
		var early time.Duration
		if ticked {
			early = tick / 2
		}
		// Up with the fallback queue still in use (a call failed, the
		// store never marked down): the requests wait there until a
		// heartbeat adopts its permits (Queue.inFallback). Up with
		// permits given meanwhile that the store does not count yet
		// (fail open): a down the loop never read (a call on its way
		// since before the mark, its own among them, marked the store
		// up again before the loop looked), or none at all (a requeue
		// whose one call failed, answered by the policy with the store
		// still up); until the heartbeat that adopts them, the store
		// grants beside them.
		beat := time.Since(lastBeat) >= due(cfg)-early || s.takeResync() || (up && !wasUp) ||
			(up && s.verify && waiting > 0) || (up && q.inFallback()) || (up && unadopted > 0)
		if beat {
			began := time.Now()
			if !s.heartbeat(cfg) {
				// Its reply may be lost with tickets it re-added that
				// this node had released: reconcile finds such ghosts.
				sweepUntil = time.Now().Add(cfg.Lease / 3)
			} else if up {
				// Back, and this node's local permits are counted by the
				// store (adopted): the fallback queue's waiters move.
				q.retireLocal()
			}
			lastBeat = began
			beatLeases = [2]time.Duration{beatLeases[1], cfg.Lease}
			if p := period(cfg); p != tick {
				tick = p
				ticker.Reset(tick)
			}
		}
		if s.take(); s.sweep {
			s.sweep = false
			sweepUntil = time.Now().Add(cfg.Lease / 3) // a failed transfer may leave a ghost
		}
		recheck, coolEnd := s.recheck, s.coolEnd
		s.recheck, s.coolEnd = false, false
		if waiting > 0 || !up || recheck || coolEnd || time.Now().Before(sweepUntil) {
			s.reconcile()
		}
		if recheck {
			s.verify = true // the next heartbeat, at once, names every waiter
			s.wake()
		}
		if !up && q.health.up() && q.inFallback() {
			s.wake() // found up: the heartbeat that adopts goes now
		}
		wasUp = up
	}
}

// reconcile dispatches permits freed by expired leases and matches the
// store's holders of this node with local tickets: a pending ticket found
// there was granted and its message lost; an unknown one is a ghost (its
// ticket ended while its grant or release was in flight) and is released.
// It dispatches under the settings in force as it is sent, not those the
// loop read before its heartbeat: a reload that landed meanwhile may allow
// fewer permits (a lowered setting, a learned capacity turned on), which
// every call sent from the reload on keeps to.
func (s *session) reconcile() {
	q := s.q
	cfg := q.cfg.Load()
	ctx, cancel := context.WithTimeout(context.Background(), cfg.StoreTimeout)
	defer cancel()
	sent := time.Now()
	res, err := q.store.Reconcile(ctx, q.node, cfg.limits())
	q.health.record(q.log, err)
	if err != nil {
		return
	}
	q.observe(res.Grants, res.Epoch)
	if res.Epoch == "" && s.seen.Load() != nil {
		s.doubt()
		s.note(evResync, true) // the data set is gone: heartbeat at once
	}
	q.rate.sample(res.Grants, time.Now())
	// Read a lease or more after the call, the holders it lists may have
	// been reaped since and their permits given to others.
	fresh := answeredInLease(sent, cfg.Lease)
	for _, id := range res.Holders {
		t := q.lookup(id)
		switch {
		case t == nil:
			q.releaseID(id, q.refundOf(id))
		case t.state.Load() == statePending && !fresh:
			s.note(evRecheck, true)
		case t.state.Load() == statePending:
			if c := q.log.Check(zapcore.DebugLevel, "grant found by reconcile"); c != nil {
				c.Write(zap.String("ticket", id))
			}
			q.grant(t, 0, res.Upstreams[id], 0)
		}
	}
}
