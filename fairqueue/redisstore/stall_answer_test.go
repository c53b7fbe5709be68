package redisstore_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
	"github.com/fair-queue/caddy-fair-queue/internal/redistest"
)

// stopAfterAcquire wraps a node's store and models the node's process
// stopped (SIGSTOP, a long GC pause, a starved VM) right after its next
// acquire reached Redis, before its answer is read: that answer, and
// every heartbeat and reconcile of the node, wait until resume is
// closed. Calls that waited are sent with a fresh deadline, as a
// resumed process sends them.
type stopAfterAcquire struct {
	fairqueue.Store
	next    atomic.Bool   // stop after the next acquire
	stopped atomic.Bool   // stopped: calls wait for resume
	ran     chan struct{} // closed once that acquire ran in Redis
	resume  chan struct{}
}

func newStopAfterAcquire(s fairqueue.Store) *stopAfterAcquire {
	return &stopAfterAcquire{Store: s, ran: make(chan struct{}), resume: make(chan struct{})}
}

// hold waits while the node is stopped, and returns the context its
// call goes with.
func (s *stopAfterAcquire) hold(ctx context.Context) (context.Context, context.CancelFunc) {
	if !s.stopped.Load() {
		return ctx, func() {}
	}
	<-s.resume
	return context.WithTimeout(context.Background(), time.Second)
}

func (s *stopAfterAcquire) Acquire(ctx context.Context, t fairqueue.TicketArgs) (fairqueue.AcquireResult, error) {
	if s.next.CompareAndSwap(true, false) {
		res, err := s.Store.Acquire(ctx, t)
		s.stopped.Store(true)
		close(s.ran)
		<-s.resume
		return res, err
	}
	ctx, cancel := s.hold(ctx)
	defer cancel()
	return s.Store.Acquire(ctx, t)
}

func (s *stopAfterAcquire) Heartbeat(ctx context.Context, hb fairqueue.HeartbeatArgs) (fairqueue.HeartbeatResult, error) {
	ctx, cancel := s.hold(ctx)
	defer cancel()
	return s.Store.Heartbeat(ctx, hb)
}

func (s *stopAfterAcquire) Reconcile(ctx context.Context, node string, l fairqueue.Limits) (fairqueue.ReconcileResult, error) {
	ctx, cancel := s.hold(ctx)
	defer cancel()
	return s.Store.Reconcile(ctx, node, l)
}

// A node stopped past its lease right after Redis granted its request
// at once, the answer unread: its heartbeats stop, the grant's lease ends
// unrenewed, and Redis gives the permit to another node's request. Once
// resumed, the node reads the old answer: it must not start its request
// beside the one that now holds the permit (2 running on 1 permit, by a
// request that had not started before the stop); the request is served
// once the permit is free, and Redis is left clean.
func TestAcquireAnswerReadAfterAStopPastTheLeaseStartsNoGrantRedisTookBack(t *testing.T) {
	srv := redistest.Start(t)
	cfg := fairqueue.Config{Permits: 1, Lease: time.Second, PollInterval: 50 * time.Millisecond, MaxWait: 30 * time.Second}
	var st *stopAfterAcquire
	a := wrappedNode(t, srv, "stopped", cfg, func(s fairqueue.Store) fairqueue.Store {
		st = newStopAfterAcquire(s)
		return st
	})
	b := newNode(t, srv, "stopped", cfg)
	ctx := context.Background()
	p, err := a.q.Acquire(ctx, fairqueue.Request{}) // a joins the queue
	require.NoError(t, err)
	p.Release()

	st.next.Store(true)
	aDone := acquireAsync(a, ctx)
	<-st.ran // Redis granted a's request; a is stopped before it reads so

	// b's request waits until the lease of a's grant ends unrenewed.
	bCtx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	pb, err := b.q.Acquire(bCtx, fairqueue.Request{})
	require.NoError(t, err, "a's grant was never taken back")
	require.Equal(t, []string{pb.Ticket()}, readState(t, b.rdb, "stopped").Holders)

	close(st.resume) // a goes on, reading the old answer
	select {
	case r := <-aDone:
		if r.err == nil {
			r.p.Release()
		}
		pb.Release()
		t.Fatalf("a's request started on a grant Redis had taken back (err %v), beside b's on the only permit", r.err)
	case <-time.After(3 * cfg.Lease):
	}
	pb.Release()
	select {
	case r := <-aDone:
		require.NoError(t, r.err, "a's request is served once the permit is free")
		r.p.Release()
	case <-time.After(20 * time.Second):
		t.Fatal("a's request was not served once the permit was free")
	}
	require.NoError(t, a.q.Close())
	require.NoError(t, b.q.Close())
	require.Empty(t, srv.Keys(t, "{fair_queue:stopped}*"), "keys left after every node left")
}
