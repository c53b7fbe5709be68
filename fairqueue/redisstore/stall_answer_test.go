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

// stopAfter wraps a node's store and models the node's process stopped
// (SIGSTOP, a long GC pause, a starved VM) right after one of its calls
// reached Redis, before its answer is read: the next acquire (next
// "acquire"), or the next reconcile that lists a holder of the node
// (next "reconcile"). That answer, and every heartbeat, reconcile and
// acquire of the node, wait until resume is closed; calls that waited
// are sent with a fresh deadline, as a resumed process sends them. With
// drop set, grant messages are lost (as while Pub/Sub reconnects).
type stopAfter struct {
	fairqueue.Store
	next    atomic.Value  // the call to stop after: "acquire", "reconcile"
	stopped atomic.Bool   // stopped: calls wait for resume
	drop    atomic.Bool   // grant messages are lost
	ran     chan struct{} // closed once that call ran in Redis
	resume  chan struct{}
}

func newStopAfter(s fairqueue.Store) *stopAfter {
	st := &stopAfter{Store: s, ran: make(chan struct{}), resume: make(chan struct{})}
	st.next.Store("")
	return st
}

// stopHere stops the node after a call of kind that ran, if it is the
// one to stop after, and waits for resume.
func (s *stopAfter) stopHere(kind string) {
	if !s.next.CompareAndSwap(kind, "") {
		return
	}
	s.stopped.Store(true)
	close(s.ran)
	<-s.resume
}

// hold waits while the node is stopped, and returns the context its
// call goes with.
func (s *stopAfter) hold(ctx context.Context) (context.Context, context.CancelFunc) {
	if !s.stopped.Load() {
		return ctx, func() {}
	}
	<-s.resume
	return context.WithTimeout(context.Background(), time.Second)
}

func (s *stopAfter) Open(ctx context.Context, node string, h fairqueue.Listener) error {
	return s.Store.Open(ctx, node, droppingListener{h, s})
}

func (s *stopAfter) Acquire(ctx context.Context, t fairqueue.TicketArgs) (fairqueue.AcquireResult, error) {
	ctx, cancel := s.hold(ctx)
	defer cancel()
	res, err := s.Store.Acquire(ctx, t)
	if err == nil {
		s.stopHere("acquire")
	}
	return res, err
}

func (s *stopAfter) Heartbeat(ctx context.Context, hb fairqueue.HeartbeatArgs) (fairqueue.HeartbeatResult, error) {
	ctx, cancel := s.hold(ctx)
	defer cancel()
	return s.Store.Heartbeat(ctx, hb)
}

func (s *stopAfter) Reconcile(ctx context.Context, node string, l fairqueue.Limits) (fairqueue.ReconcileResult, error) {
	ctx, cancel := s.hold(ctx)
	defer cancel()
	res, err := s.Store.Reconcile(ctx, node, l)
	if err == nil && len(res.Holders) > 0 {
		s.stopHere("reconcile")
	}
	return res, err
}

// droppingListener loses grant messages while its stopAfter's drop is set.
type droppingListener struct {
	fairqueue.Listener
	s *stopAfter
}

func (h droppingListener) Granted(gs ...fairqueue.Grant) {
	if !h.s.drop.Load() {
		h.Listener.Granted(gs...)
	}
}

// A node stopped past its lease right after Redis granted its request
// at once, the answer unread: its heartbeats stop, the grant's lease ends
// unrenewed, and Redis gives the permit to another node's request. Once
// resumed, the node reads the old answer: it must not start its request
// beside the one that now holds the permit (2 running on 1 permit, by a
// request that had not started before the stop); the request is served
// once the permit is free, and Redis is left clean.
func TestAcquireAnswerReadAfterAStopPastTheLeaseStartsNoGrantRedisTookBack(t *testing.T) {
	srv, cfg, a, b, st := stoppedPair(t)
	ctx := context.Background()

	st.next.Store("acquire")
	aDone := acquireAsync(a, ctx)
	<-st.ran // Redis granted a's request; a is stopped before it reads so

	// b's request waits until the lease of a's grant ends unrenewed.
	bCtx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	pb, err := b.q.Acquire(bCtx, fairqueue.Request{})
	require.NoError(t, err, "a's grant was never taken back")
	require.Equal(t, []string{pb.Ticket()}, readState(t, b.rdb, "stopped").Holders)

	close(st.resume) // a goes on, reading the old answer
	noStartBeside(t, aDone, pb, 3*cfg.Lease)
	servedOnceFree(t, srv, a, b, pb, aDone)
}

// A node stopped past its lease right after a reconcile listed a grant
// to its waiter whose message was lost: its heartbeats stop, the grant's
// lease ends unrenewed, and Redis gives the permit to another node's
// waiter. Once resumed, the node reads the old reconcile's answer: it
// must not start its waiter beside the request that now holds the
// permit; the waiter is served once the permit is free.
func TestReconcileAnswerReadAfterAStopPastTheLeaseStartsNoGrantRedisTookBack(t *testing.T) {
	srv, cfg, a, b, st := stoppedPair(t)
	ctx := context.Background()
	pb, err := b.q.Acquire(ctx, fairqueue.Request{})
	require.NoError(t, err)

	st.drop.Store(true)
	st.next.Store("reconcile")
	aDone := acquireAsync(a, ctx)
	eventually(t, 5*time.Second, func() bool { return len(readState(t, b.rdb, "stopped").Waiting) == 1 }, "a's waiter not queued")
	bDone := acquireAsync(b, ctx)
	eventually(t, 5*time.Second, func() bool { return len(readState(t, b.rdb, "stopped").Waiting) == 2 }, "b's waiter not queued")
	pb.Release() // grants a's waiter; its message is lost
	<-st.ran     // a's reconcile found the grant; a is stopped before it reads so

	// b's waiter is granted once the lease of a's grant ends unrenewed.
	pb2 := takenBack(t, b, "stopped", bDone)

	st.drop.Store(false)
	close(st.resume) // a goes on, reading the old answer
	noStartBeside(t, aDone, pb2, 3*cfg.Lease)
	servedOnceFree(t, srv, a, b, pb2, aDone)
}

// noStartBeside fails the test if a's request (aDone) has started, on a
// grant Redis took back, beside pb on the only permit; block: wait for
// it that long, else look once.
func noStartBeside(t *testing.T, aDone <-chan acquired, pb *fairqueue.Permit, block time.Duration) {
	t.Helper()
	var r acquired
	if block > 0 {
		select {
		case r = <-aDone:
		case <-time.After(block):
			return
		}
	} else {
		select {
		case r = <-aDone:
		default:
			return
		}
	}
	if r.err == nil {
		r.p.Release()
	}
	pb.Release()
	t.Fatalf("a's request started on a grant Redis had taken back (err %v), beside b's on the only permit", r.err)
}

// takenBack returns b's request (bDone), granted once the lease of a's
// grant ended unrenewed: the only holder of queue name.
func takenBack(t *testing.T, b *node, name string, bDone <-chan acquired) *fairqueue.Permit {
	t.Helper()
	select {
	case r := <-bDone:
		require.NoError(t, r.err)
		require.Equal(t, []string{r.p.Ticket()}, readState(t, b.rdb, name).Holders)
		return r.p
	case <-time.After(20 * time.Second):
		t.Fatal("a's grant was never taken back")
		return nil
	}
}

// servedOnceFree releases pb, then requires a's requests (each of
// waits) served, and, once both nodes closed, nothing left in Redis.
func servedOnceFree(t *testing.T, srv *redistest.Server, a, b *node, pb *fairqueue.Permit, waits ...<-chan acquired) {
	t.Helper()
	pb.Release()
	for _, ch := range waits {
		select {
		case r := <-ch:
			require.NoError(t, r.err, "a's request is served once the permit is free")
			r.p.Release()
		case <-time.After(20 * time.Second):
			t.Fatal("a's request was not served once the permit was free")
		}
	}
	require.NoError(t, a.q.Close())
	require.NoError(t, b.q.Close())
	require.Empty(t, srv.Keys(t, "*"), "keys left after every node left")
}

// stoppedPair opens queue "stopped" (1 permit, a lease of 1s) on a new
// Redis as two nodes: a, whose calls st can stop, joined the queue, and b.
func stoppedPair(t *testing.T) (srv *redistest.Server, cfg fairqueue.Config, a, b *node, st *stopAfter) {
	t.Helper()
	srv = redistest.Start(t)
	cfg = fairqueue.Config{Permits: 1, Lease: time.Second, PollInterval: 50 * time.Millisecond, MaxWait: 30 * time.Second}
	a = wrappedNode(t, srv, "stopped", cfg, func(s fairqueue.Store) fairqueue.Store {
		st = newStopAfter(s)
		return st
	})
	b = newNode(t, srv, "stopped", cfg)
	p, err := a.q.Acquire(context.Background(), fairqueue.Request{}) // a joins the queue
	require.NoError(t, err)
	p.Release()
	return srv, cfg, a, b, st
}
