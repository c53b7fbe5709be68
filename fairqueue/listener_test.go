package fairqueue_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
	"github.com/fair-queue/caddy-fair-queue/fairqueue/memstore"
)

// lateGrants is an in-process store whose grant notifications are held
// back until the test delivers them: a Pub/Sub message that comes late.
type lateGrants struct {
	*memstore.Store
	mu   sync.Mutex
	h    fairqueue.Listener
	held chan []fairqueue.Grant
}

func (s *lateGrants) Open(ctx context.Context, node string, h fairqueue.Listener) error {
	s.mu.Lock()
	s.h = h
	s.mu.Unlock()
	return s.Store.Open(ctx, node, holdBack{s.held})
}

// deliver hands gs to the node, late.
func (s *lateGrants) deliver(gs []fairqueue.Grant) {
	s.mu.Lock()
	h := s.h
	s.mu.Unlock()
	h.Granted(gs...)
}

type holdBack struct{ held chan []fairqueue.Grant }

func (l holdBack) Granted(gs ...fairqueue.Grant) { l.held <- gs }
func (l holdBack) Resynced()                     {}

// handoffObserver records the handoffs a Queue reports.
type handoffObserver struct {
	mu sync.Mutex
	d  []time.Duration
}

func (o *handoffObserver) Granted(time.Duration, bool)              {}
func (o *handoffObserver) Rejected(fairqueue.Reason, time.Duration) {}
func (o *handoffObserver) StoreError(error)                         {}
func (o *handoffObserver) Handoff(d time.Duration) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.d = append(o.d, d)
}

func (o *handoffObserver) seen() []time.Duration {
	o.mu.Lock()
	defer o.mu.Unlock()
	return append([]time.Duration(nil), o.d...)
}

// A grant that reconcile finds before its message arrives woke its
// waiter then: the late message gives the grant's number and time, and
// the handoff is observed once, with the latency to that wake-up, not to
// the message; a duplicate of the message changes nothing.
func TestHandoffFoundByReconcileIsObservedOnceWhenItsMessageComes(t *testing.T) {
	st := &lateGrants{Store: memstore.New(), held: make(chan []fairqueue.Grant, 8)}
	obs := &handoffObserver{}
	q, err := fairqueue.New(st, fairqueue.Config{Name: "late", Permits: 1, MaxWait: time.Minute,
		PollInterval: 50 * time.Millisecond, Observer: obs})
	require.NoError(t, err)
	t.Cleanup(func() { _ = q.Close() })

	p, err := q.Acquire(context.Background(), fairqueue.Request{})
	require.NoError(t, err)
	queued := make(chan struct{})
	got := make(chan *fairqueue.Permit, 1)
	go func() {
		p2, err := q.Acquire(context.Background(), fairqueue.Request{OnQueued: func(fairqueue.Waiting) { close(queued) }})
		assert.NoError(t, err)
		got <- p2
	}()
	select {
	case <-queued:
	case <-time.After(5 * time.Second):
		t.Fatal("the second acquire was not queued")
	}
	released := time.Now()
	p.Release()
	var gs []fairqueue.Grant
	select {
	case gs = <-st.held:
	case <-time.After(5 * time.Second):
		t.Fatal("the release granted nobody")
	}
	var p2 *fairqueue.Permit
	select {
	case p2 = <-got: // woken by a reconcile
	case <-time.After(5 * time.Second):
		t.Fatal("reconcile did not find the grant")
	}
	require.NotNil(t, p2)
	defer p2.Release()
	woken := time.Since(released)
	require.Len(t, gs, 1)
	require.Equal(t, p2.Ticket(), gs[0].Ticket)
	assert.Zero(t, p2.GrantNo(), "the number is not known before the message")
	assert.Empty(t, obs.seen(), "the grant's time is not known before the message")

	time.Sleep(200 * time.Millisecond) // the message is late
	st.deliver(gs)
	st.deliver(gs) // and sent twice
	assert.Equal(t, gs[0].No, p2.GrantNo(), "the message gives the number")
	d := obs.seen()
	require.Len(t, d, 1, "one handoff")
	assert.LessOrEqual(t, d[0], woken, "the handoff lasted until the wake-up, not until the message")
}
