package fairqueue_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
	"github.com/fair-queue/caddy-fair-queue/fairqueue/memstore"
	"github.com/fair-queue/caddy-fair-queue/fairqueue/redisstore"
	"github.com/fair-queue/caddy-fair-queue/internal/redistest"
)

// heldBeat is a store whose first heartbeat that names a held permit (and
// is not a join) waits, after the node took its snapshot, until the test
// lets it go, and reports what the store counted.
type heldBeat struct {
	*memstore.Store
	once  sync.Once
	sent  chan struct{} // closed when the heartbeat waits
	let   chan struct{} // closed by the test to let it go
	after chan fairqueue.HeartbeatResult
}

func (s *heldBeat) Heartbeat(ctx context.Context, hb fairqueue.HeartbeatArgs) (fairqueue.HeartbeatResult, error) {
	hold := false
	if hb.Beat >= 2 && len(hb.Held) > 0 {
		s.once.Do(func() { hold = true })
	}
	if hold {
		close(s.sent)
		<-s.let
	}
	res, err := s.Store.Heartbeat(ctx, hb)
	if hold {
		s.after <- res
	}
	return res, err
}

// A permit released while a heartbeat that names it is on its way, its
// permit handed on, is not counted again when the heartbeat reaches the
// store: the store counts no more holders than permits.
func TestPermitReleasedWhileAHeartbeatIsOnItsWayIsNotCountedAgain(t *testing.T) {
	st := &heldBeat{Store: memstore.New(), sent: make(chan struct{}), let: make(chan struct{}),
		after: make(chan fairqueue.HeartbeatResult, 1)}
	q, err := fairqueue.New(st, fairqueue.Config{Name: "beat", Permits: 1, Lease: time.Second,
		PollInterval: 50 * time.Millisecond, MaxWait: 20 * time.Second})
	require.NoError(t, err)
	t.Cleanup(func() { _ = q.Close() })

	p, err := q.Acquire(context.Background(), fairqueue.Request{})
	require.NoError(t, err)
	next := make(chan *fairqueue.Permit, 1)
	go func() {
		n, err := q.Acquire(context.Background(), fairqueue.Request{})
		assert.NoError(t, err)
		next <- n
	}()
	select {
	case <-st.sent:
	case <-time.After(10 * time.Second):
		t.Fatal("no heartbeat named the held permit")
	}
	p.Release() // hands the permit to the waiter
	close(st.let)
	res := <-st.after
	assert.Empty(t, res.Readded, "the heartbeat counted the released permit again")
	assert.Equal(t, 1, res.Cluster.Holders, "holders counted in the store, 1 permit")
	(<-next).Release()
}

// movingBeat is a Redis store whose first local handoff's transfer waits
// for a heartbeat of the node (not a join) to run in the store, and
// reports what that heartbeat counted.
type movingBeat struct {
	*redisstore.Store
	beats  atomic.Int32
	once   sync.Once
	moving atomic.Bool
	res    atomic.Pointer[fairqueue.HeartbeatResult]
	done   chan struct{} // closed once res is set
}

func (s *movingBeat) Transfer(ctx context.Context, t fairqueue.TicketArgs, to string) error {
	first := false
	s.once.Do(func() { first = true })
	if first {
		s.moving.Store(true)
		select {
		case <-s.done:
		case <-time.After(10 * time.Second): // the test fails: no heartbeat
		}
	}
	return s.Store.Transfer(ctx, t, to)
}

func (s *movingBeat) Heartbeat(ctx context.Context, hb fairqueue.HeartbeatArgs) (fairqueue.HeartbeatResult, error) {
	res, err := s.Store.Heartbeat(ctx, hb)
	s.beats.Add(1)
	if err == nil && !res.Rejoined && s.moving.CompareAndSwap(true, false) {
		s.res.Store(&res)
		close(s.done)
	}
	return res, err
}

// A waiter started by a local handoff whose transfer is still on its way
// is left to the transfer by a heartbeat sent meanwhile: the heartbeat
// does not count it besides the holder it replaces, so the store counts
// no more holders than permits.
func TestWaiterOfALocalHandoffOnItsWayIsNotCountedTwice(t *testing.T) {
	rds := redistest.Start(t)
	st := &movingBeat{Store: redisstore.New(rds.Client(t), "moving", redisstore.Options{}),
		done: make(chan struct{})}
	q, err := fairqueue.New(st, fairqueue.Config{Name: "moving", Permits: 1, Lease: time.Second,
		PollInterval: 50 * time.Millisecond, MaxWait: 20 * time.Second})
	require.NoError(t, err)
	t.Cleanup(func() { _ = q.Close() })

	first, err := q.Acquire(context.Background(), fairqueue.Request{})
	require.NoError(t, err)
	next := make(chan *fairqueue.Permit, 2)
	for i := range 2 { // one after the other: the third waits behind the second
		go func() {
			n, err := q.Acquire(context.Background(), fairqueue.Request{})
			assert.NoError(t, err)
			next <- n
		}()
		require.Eventually(t, func() bool { return q.Stats().Waiting == i+1 }, 10*time.Second, time.Millisecond)
	}
	// The node is confirmed alive (its join and the heartbeat after it),
	// so its releases may hand on locally.
	require.Eventually(t, func() bool { return st.beats.Load() >= 3 }, 10*time.Second, time.Millisecond)
	first.Release() // through the store: grants the second, names the third the head
	second := <-next
	require.Eventually(t, q.HeadIsOwn, 10*time.Second, time.Millisecond)
	second.Release() // a local handoff to the third; its transfer waits for a heartbeat
	third := <-next
	select {
	case <-st.done:
		res := st.res.Load()
		assert.Empty(t, res.Readded, "the heartbeat counted the waiter the transfer moves")
		assert.Equal(t, 1, res.Cluster.Holders, "holders counted in the store, 1 permit")
	case <-time.After(10 * time.Second):
		t.Fatal("no local handoff, or no heartbeat while its transfer was on its way")
	}
	third.Release()
}
