package redisstore_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
	"github.com/fair-queue/caddy-fair-queue/internal/redistest"
)

// stopAfterBeat wraps a node's store and models the node's process
// stopped (SIGSTOP, a long GC pause, a starved VM) right after it read
// the answer of a heartbeat that found it alive (next heartbeat once arm
// is set), with a grant message still unread (held while hold is set):
// every later call of the node waits until resume, and the held messages
// are read first then.
type stopAfterBeat struct {
	fairqueue.Store
	arm     atomic.Bool // stop after the next heartbeat that succeeds
	stopped atomic.Bool
	hold    atomic.Bool // grant messages wait, unread
	// sendHold: the next acquire waits before it is sent, until sendGo
	// is closed (its ticket is older than the next one's).
	sendHold atomic.Bool
	sendGo   chan struct{}
	ticked   chan struct{} // a reconcile ran (the node's loop ended a tick)
	ran      chan struct{} // closed once the node is stopped
	resume   chan struct{}

	mu   sync.Mutex
	h    fairqueue.Listener
	held []fairqueue.Grant
}

func newStopAfterBeat(s fairqueue.Store) *stopAfterBeat {
	return &stopAfterBeat{Store: s, ticked: make(chan struct{}, 1), ran: make(chan struct{}), resume: make(chan struct{}),
		sendGo: make(chan struct{})}
}

// wait holds a call while the node is stopped, and returns the context
// it goes with.
func (s *stopAfterBeat) wait(ctx context.Context) (context.Context, context.CancelFunc) {
	if !s.stopped.Load() {
		return ctx, func() {}
	}
	<-s.resume
	return context.WithTimeout(context.Background(), time.Second)
}

// wake resumes the node: it reads the grant messages held, then its
// calls go on.
func (s *stopAfterBeat) wake() {
	s.mu.Lock()
	s.hold.Store(false)
	held := s.held
	s.held = nil
	s.mu.Unlock()
	if len(held) > 0 {
		s.h.Granted(held...)
	}
	close(s.resume)
}

func (s *stopAfterBeat) Open(ctx context.Context, node string, h fairqueue.Listener) error {
	s.h = h
	return s.Store.Open(ctx, node, holdingListener{h, s})
}

func (s *stopAfterBeat) Acquire(ctx context.Context, t fairqueue.TicketArgs) (fairqueue.AcquireResult, error) {
	if s.sendHold.CompareAndSwap(true, false) {
		<-s.sendGo
	}
	ctx, cancel := s.wait(ctx)
	defer cancel()
	return s.Store.Acquire(ctx, t)
}

func (s *stopAfterBeat) Heartbeat(ctx context.Context, hb fairqueue.HeartbeatArgs) (fairqueue.HeartbeatResult, error) {
	ctx, cancel := s.wait(ctx)
	defer cancel()
	res, err := s.Store.Heartbeat(ctx, hb)
	if err == nil && !res.Rejoined && s.arm.CompareAndSwap(true, false) {
		s.stopped.Store(true) // the calls after this answer wait
		close(s.ran)
	}
	return res, err
}

func (s *stopAfterBeat) Reconcile(ctx context.Context, node string, l fairqueue.Limits) (fairqueue.ReconcileResult, error) {
	ctx, cancel := s.wait(ctx)
	defer cancel()
	res, err := s.Store.Reconcile(ctx, node, l)
	select {
	case s.ticked <- struct{}{}:
	default:
	}
	return res, err
}

// holdingListener keeps grant messages unread while its stopAfterBeat
// holds them.
type holdingListener struct {
	fairqueue.Listener
	s *stopAfterBeat
}

func (h holdingListener) Granted(gs ...fairqueue.Grant) {
	h.s.mu.Lock()
	if h.s.hold.Load() {
		h.s.held = append(h.s.held, gs...)
		h.s.mu.Unlock()
		return
	}
	h.s.mu.Unlock()
	h.Listener.Granted(gs...)
}

// A grant message still unread when a heartbeat finds the node alive,
// then a stop (SIGSTOP, a long GC pause, a starved CPU) of less than a
// lease from that heartbeat but more than what was left of the grant's
// lease: Redis reaps the grant, unrenewed, and gives the permit to
// another node's waiter. Once resumed, the node reads the old message:
// it must not start its waiter beside the request that now holds the
// only permit (a heartbeat less than a lease ago confirmed the node, but
// the grant is older than that heartbeat); the waiter is served once the
// permit is free, and Redis is left clean.
func TestGrantMessageOlderThanTheLastHeartbeatReadAfterAStopStartsNoGrantRedisTookBack(t *testing.T) {
	srv := redistest.Start(t)
	cfgA := fairqueue.Config{Permits: 1, Lease: 3 * time.Second, PollInterval: time.Second, MaxWait: 30 * time.Second}
	cfgB := cfgA
	cfgB.PollInterval = 50 * time.Millisecond
	var st *stopAfterBeat
	a := wrappedNode(t, srv, "beatstop", cfgA, func(s fairqueue.Store) fairqueue.Store {
		st = newStopAfterBeat(s)
		return st
	})
	b := newNode(t, srv, "beatstop", cfgB)
	ctx := context.Background()
	p, err := a.q.Acquire(ctx, fairqueue.Request{}) // a joins the queue
	require.NoError(t, err)
	p.Release()
	pb, err := b.q.Acquire(ctx, fairqueue.Request{})
	require.NoError(t, err)

	aDone := acquireAsync(a, ctx)
	eventually(t, 5*time.Second, func() bool { return len(readState(t, b.rdb, "beatstop").Waiting) == 1 }, "a's waiter not queued")
	aTicket := readState(t, b.rdb, "beatstop").Waiting[0]
	bDone := acquireAsync(b, ctx)
	eventually(t, 5*time.Second, func() bool { return len(readState(t, b.rdb, "beatstop").Waiting) == 2 }, "b's waiter not queued")

	st.hold.Store(true)
	// Right after a's tick (its heartbeat and reconcile), so that its
	// next heartbeat, a tick later, confirms it well after the grant
	// (not one sent at once after a rejoin: two ticks seen first).
	for range 2 {
		select {
		case <-st.ticked:
		default:
		}
		<-st.ticked
	}
	pb.Release() // grants a's waiter; its message stays unread
	time.Sleep(cfgA.PollInterval / 4)
	st.arm.Store(true)
	<-st.ran // a heartbeat found a alive; a is stopped before its reconcile

	// b's waiter is granted once the lease of a's grant ends unrenewed,
	// less than a lease after that heartbeat.
	pb2 := takenBack(t, b, "beatstop", bDone)

	st.wake() // a goes on, reading the old message first
	for end := time.Now().Add(10 * time.Second); ; {
		noStartBeside(t, aDone, pb2, 0)
		if s := readState(t, b.rdb, "beatstop"); len(s.Waiting) == 1 && s.Waiting[0] == aTicket {
			break // a found its waiter lost and queued it again
		}
		require.True(t, time.Now().Before(end), "a's waiter was neither started nor queued again")
		time.Sleep(10 * time.Millisecond)
	}
	servedOnceFree(t, srv, a, b, pb2, aDone)
}

// As above, with an older waiter of the same node still queued behind the
// grant (its call reached Redis later) and another node's waiter between
// them, which gets the permit Redis took back: the waiter of the old
// message must be queued again promptly (at the tail), not left out of
// the queue while the node's older waiter waits (the heartbeats name only
// the oldest waiter): there, later requests would pass it, and it would
// be queued again only once every older waiter of its node is served.
func TestGrantMessageOlderThanTheLastHeartbeatTakenBackIsQueuedAgainBehindAnOlderWaiter(t *testing.T) {
	srv := redistest.Start(t)
	cfgA := fairqueue.Config{Permits: 1, Lease: 3 * time.Second, PollInterval: time.Second, MaxWait: 60 * time.Second}
	cfgB := cfgA
	cfgB.PollInterval = 50 * time.Millisecond
	var st *stopAfterBeat
	a := wrappedNode(t, srv, "beatstop2", cfgA, func(s fairqueue.Store) fairqueue.Store {
		st = newStopAfterBeat(s)
		return st
	})
	b := newNode(t, srv, "beatstop2", cfgB)
	ctx := context.Background()
	p, err := a.q.Acquire(ctx, fairqueue.Request{}) // a joins the queue
	require.NoError(t, err)
	p.Release()
	pb, err := b.q.Acquire(ctx, fairqueue.Request{})
	require.NoError(t, err)
	waiting := func() []string { return readState(t, b.rdb, "beatstop2").Waiting }

	st.sendHold.Store(true)
	olderDone := acquireAsync(a, ctx) // a's older request: its call waits
	eventually(t, 5*time.Second, func() bool { return !st.sendHold.Load() }, "a's older request never sent")
	aDone := acquireAsync(a, ctx)
	eventually(t, 5*time.Second, func() bool { return len(waiting()) == 1 }, "a's waiter not queued")
	aTicket := waiting()[0]
	bDone := acquireAsync(b, ctx)
	eventually(t, 5*time.Second, func() bool { return len(waiting()) == 2 }, "b's waiter not queued")
	close(st.sendGo)
	eventually(t, 5*time.Second, func() bool { return len(waiting()) == 3 }, "a's older waiter not queued")
	older := waiting()[2]

	st.hold.Store(true)
	for range 2 {
		select {
		case <-st.ticked:
		default:
		}
		<-st.ticked
	}
	pb.Release() // grants a's waiter; its message stays unread
	time.Sleep(cfgA.PollInterval / 4)
	st.arm.Store(true)
	<-st.ran // a heartbeat found a alive; a is stopped before its reconcile

	pb2 := takenBack(t, b, "beatstop2", bDone)

	st.wake() // a goes on, reading the old message first
	for end := time.Now().Add(4 * cfgA.Lease); ; {
		noStartBeside(t, aDone, pb2, 0)
		if w := waiting(); len(w) == 2 && w[0] == older && w[1] == aTicket {
			break // queued again, behind a's older waiter
		}
		require.True(t, time.Now().Before(end), "a's waiter %s is not queued again while a's older one waits (waiting %v, holders %v)",
			aTicket, waiting(), readState(t, b.rdb, "beatstop2").Holders)
		time.Sleep(10 * time.Millisecond)
	}
	servedOnceFree(t, srv, a, b, pb2, olderDone, aDone)
}
