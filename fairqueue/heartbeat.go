package fairqueue

import (
	"cmp"
	"context"
	"slices"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

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
		case t.moving.Load():
			// Granted by a local handoff whose transfer is on its way:
			// the transfer counts it; named here, a heartbeat reaching the
			// store first would count it besides the holder it replaces.
		case t.registered.Load():
			held = append(held, t)
		default:
			adopt = append(adopt, t)
		}
	}
	return pending, held, adopt
}

// pendingPerCall bounds the waiters one heartbeat call names, so that a
// deep queue does not make one long script.
const pendingPerCall = 1000

// heartbeat renews this node's liveness and leases, registers fail-open
// permits, and, when the store may have lost this node's waiters (see
// evVerify), names them and reinstates those it lost. It reports
// whether the store answered. Loop only.
func (s *session) heartbeat(cfg *Config) (ok bool) {
	q := s.q
	// From the snapshot on, a permit given back is marked so that this
	// heartbeat, if it reaches the store after the release, does not
	// count it again (Permit.Release forgets the ticket, under the lock
	// the snapshot takes, before it reads this).
	s.beating.Add(1)
	defer s.beating.Add(-1)
	pending, held, adopt := q.snapshot()
	s.take()
	verify := s.verify
	s.verify = false
	s.beats++
	args := HeartbeatArgs{Node: q.node, Limits: cfg.limits(), Held: ids(held), Adopt: ids(adopt),
		Upstreams: upstreamsOf(held, adopt), Tokens: tokensOf(cfg, held, adopt), Epoch: s.epoch, Beat: s.beats}
	var more []string   // pending tickets for further calls of this heartbeat
	var named []*ticket // the pending tickets this heartbeat names
	if verify {
		// In the order made: those the store lost are queued again in
		// the order named, at the tail, and keep their order there.
		slices.SortFunc(pending, func(a, b *ticket) int { return cmp.Compare(a.no, b.no) })
		all := ids(pending)
		n := min(len(all), pendingPerCall)
		args.Pending, more = all[:n], all[n:]
		named = pending
	} else if t := oldest(pending); t != nil {
		// One waiter named every time: Redis may lose the queue's list
		// of waiters with nothing else to tell (an eviction under
		// maxmemory deletes the key: no error, no disconnect, the epoch
		// kept). The one waiting longest was queued before any such
		// loss, whatever came after. Found missing, it is queued again
		// and the next heartbeat names every waiter.
		args.Pending = []string{t.id}
		named = []*ticket{t}
	}
	args.Tokens = queuedWeights(args.Tokens, named)
	if args.Epoch == "" {
		if e := s.seen.Load(); e != nil {
			args.Epoch = *e
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), cfg.StoreTimeout)
	defer cancel()
	sent := time.Now()
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
		// The call may still run (a frozen store, a late retry): mark
		// the permits given back for a lease more.
		s.beatDoubt.Store(int64(time.Since(s.base) + cfg.Lease))
		s.verify = true
		return false
	}
	s.readded(res.Readded, res.Epoch == s.epoch)
	view := res.Cluster
	view.At = time.Now()
	s.cluster.Store(&view)
	if args.Epoch != "" && res.Epoch != args.Epoch {
		// A new data set, also where this node's first heartbeat finds
		// it (the epoch its calls saw is gone): the permits it holds are
		// counted again, and the learned shares went with the old one.
		q.log.Warn("store lost its data; re-registered this node's permits", zap.Int("held", len(held)))
		q.restoreShares(cfg)
	}
	s.epoch = res.Epoch
	s.seen.Store(&res.Epoch)
	if res.Rejoined {
		// Heartbeat again right away: that one counts the permits this
		// node still holds (a forgotten node re-adds nothing: this call
		// might have been one delayed past the node's leave) and names
		// its waiters, unless this one did.
		if !verify {
			s.verify = true
		}
		s.resync = true
		s.wake()
	}
	for len(more) > 0 && err == nil {
		// The same heartbeat (same number), the rest of its waiters: one
		// script call stays short however many wait.
		n := min(len(more), pendingPerCall)
		cctx, cancel := context.WithTimeout(context.Background(), cfg.StoreTimeout)
		var r HeartbeatResult
		r, err = q.store.Heartbeat(cctx, HeartbeatArgs{Node: q.node, Limits: args.Limits, Epoch: res.Epoch, Beat: args.Beat,
			Pending: more[:n], Tokens: args.Tokens})
		cancel()
		q.health.record(q.log, err)
		res.Missing = append(res.Missing, r.Missing...)
		more = more[n:]
	}
	if err != nil {
		s.verify = true // the waiters not yet named are named next time
	}
	if len(res.Missing) > 0 {
		if !verify {
			// The one named was lost: the others may be too.
			s.verify = true
			s.wake()
		}
		q.log.Warn("store had lost waiters of this node; queueing them again", zap.Int("waiting", len(res.Missing)))
		s.reinstate(res.Missing)
	}
	// Alive in the store, and its waiters there: not rejoined, none
	// missing, no doubt left (a failed call, a new subscription).
	s.take()
	s.confirmAlive(!res.Rejoined && err == nil && len(res.Missing) == 0 && !s.verify, sent, res.At, cfg.Lease)
	return true
}

// releaseEnded releases again, in the background, the tickets of ts
// that ended (were released) since the snapshot.
func (q *Queue) releaseEnded(ts []*ticket) {
	for _, t := range ts {
		cur := q.lookup(t.id)
		if cur != t {
			q.releaseAsync(t.id)
		}
	}
}

// reinstate queues again, at the tail, waiters the store lost, with
// their cost. Queue caps do not apply: each was admitted once. A waiter
// that ended while its acquire was on its way is cancelled again, since
// its own cancel may have reached the store first. Each of its acquires,
// which dispatch, goes under the settings in force as it is sent, not
// those the heartbeat was sent with, nor those the acquire before it
// was: a reload meanwhile may allow fewer permits.
func (s *session) reinstate(lost []string) {
	q := s.q
	for _, id := range lost {
		t := q.lookup(id)
		if t == nil || t.state.Load() != statePending {
			continue
		}
		cfg := q.cfg.Load()
		l := cfg.limits()
		l.MaxQueue, l.MaxQueuePerTenant = 0, 0
		t.reinstated.Store(true) // at the tail now: no local handoff to it
		ctx, cancel := context.WithTimeout(context.Background(), cfg.StoreTimeout)
		sent := time.Now()
		r, err := q.store.Acquire(ctx, TicketArgs{ID: id, Node: q.node, Limits: l, Cost: t.cost, Tokens: t.tokens, Asks: t.asks})
		cancel()
		q.health.record(q.log, err)
		if err != nil {
			s.verify = true // the next heartbeat names them again
			return
		}
		cur := q.lookup(id)
		switch {
		case cur != t:
			q.background(func() { q.cancelInStore(t, false, false) })
		case r.Granted && !answeredInLease(sent, l.Lease):
			s.lateGrant(t)
		case r.Granted:
			q.grant(t, r.GrantNo, r.Upstream, l.Permits)
		default:
			// Its place in the new data set, counted from that set's
			// grant counter, which may have started over below the one
			// its first place counted from.
			q.observe(r.Grants, r.Epoch)
			q.place(t, r.Position, r.Grants)
		}
	}
}

// readded logs the held tickets a heartbeat counted again that the node
// still holds: they had lost their holder entry (logged when the data set
// is the same: a new one is logged as such).
func (s *session) readded(ids []string, sameEpoch bool) {
	q := s.q
	lost := 0
	for _, id := range ids {
		t := q.lookup(id)
		if t != nil && !t.moving.Load() { // a local handoff's transfer on its way is no loss
			lost++
		}
	}
	if lost > 0 && sameEpoch && s.epoch != "" {
		q.log.Warn("store had dropped permits this node holds (a failover, or a partition longer than the lease); counted them again",
			zap.Int("permits", lost))
	}
}

// queuedWeights adds to m the weight each waiter of ts was queued with
// (TicketArgs.Tokens), where it weighs any: a store that lost it (a key
// evicted under maxmemory) records it again (HeartbeatArgs.Tokens). ts
// are the waiters a heartbeat names, not all of the node's: most name
// only the oldest.
func queuedWeights(m map[string]int, ts []*ticket) map[string]int {
	for _, t := range ts {
		if t.tokens > 0 {
			if m == nil {
				m = make(map[string]int, len(ts))
			}
			m[t.id] = t.tokens
		}
	}
	return m
}

// oldest is the waiter of ts the node made first (nil if none).
func oldest(ts []*ticket) *ticket {
	var out *ticket
	for _, t := range ts {
		if out == nil || t.no < out.no {
			out = t
		}
	}
	return out
}

func ids(ts []*ticket) []string {
	out := make([]string, len(ts))
	for i, t := range ts {
		out[i] = t.id
	}
	return out
}
