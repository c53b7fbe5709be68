package redisstore_test

import (
	"context"
	"errors"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
	"github.com/fair-queue/caddy-fair-queue/fairqueue/memstore"
	"github.com/fair-queue/caddy-fair-queue/internal/redistest"
)

// heldAdoption holds, once armed, the heartbeat that adopts the node's
// local permits into Redis until open is closed: Redis is back, and it
// does not count them yet. While the node still marks the store down,
// such a heartbeat fails at once (the node's probes then find the store
// up); once it marks it up, the heartbeat waits.
type heldAdoption struct {
	fairqueue.Store
	up      func() bool
	armed   atomic.Bool
	once    sync.Once
	entered chan struct{}
	open    chan struct{}
}

var errAdoptionHeld = errors.New("test: adoption held")

func (h *heldAdoption) Heartbeat(ctx context.Context, args fairqueue.HeartbeatArgs) (fairqueue.HeartbeatResult, error) {
	if len(args.Adopt) == 0 || !h.armed.Load() {
		return h.Store.Heartbeat(ctx, args)
	}
	if !h.up() {
		return fairqueue.HeartbeatResult{}, errAdoptionHeld
	}
	h.once.Do(func() { close(h.entered) })
	<-h.open
	cctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return h.Store.Heartbeat(cctx, args)
}

// takeLocal acquires a permit of the node's local fallback queue.
func takeLocal(t *testing.T, q *fairqueue.Queue) *fairqueue.Permit {
	t.Helper()
	p, err := q.Acquire(context.Background(), fairqueue.Request{})
	require.NoError(t, err)
	require.True(t, p.Local(), "not a local permit")
	return p
}

// Local fallback, recovery: between the store found up again and the
// heartbeat that adopts the node's running local permits, Redis counts
// none of them. A request that comes then waits (in the fallback queue,
// then in the shared one) rather than being granted by Redis beside
// them: the upstream would run the local permits and the shared ones.
func TestLocalFallbackRequestBeforeTheAdoptionWaitsForTheLocalPermits(t *testing.T) {
	t.Parallel() // its own redis-server: it waits on it, not on the CPU
	srv := redistest.Start(t)
	const name = "adoptwait"
	h := &heldAdoption{entered: make(chan struct{}), open: make(chan struct{})}
	var opened sync.Once
	openGate := func() { opened.Do(func() { close(h.open) }) }
	// A long lease: no heartbeat falls due on its own while the test runs;
	// the one that adopts is the one sent when the store is back.
	n := wrappedNode(t, srv, name, fairqueue.Config{Permits: 2, LocalPermits: 2, Fallback: memstore.New(),
		Lease: 30 * time.Second, PollInterval: 50 * time.Millisecond, MaxWait: 20 * time.Second},
		func(s fairqueue.Store) fairqueue.Store { h.Store = s; return h })
	h.up = func() bool { return n.q.Stats().StoreUp }
	t.Cleanup(openGate) // before the node closes: its loop may wait here
	p, err := n.q.Acquire(context.Background(), fairqueue.Request{})
	require.NoError(t, err)
	p.Release()

	srv.Kill()
	l1, l2 := takeLocal(t, n.q), takeLocal(t, n.q)
	h.armed.Store(true)
	srv.Restart()
	eventually(t, 10*time.Second, func() bool { return n.q.Stats().StoreUp }, "store never back up")
	select {
	case <-h.entered:
	case <-time.After(10 * time.Second):
		t.Fatal("no heartbeat adopted the local permits")
	}

	// The adoption is on its way; both local permits run.
	got := make(chan *fairqueue.Permit, 1)
	go func() {
		p, err := n.q.Acquire(context.Background(), fairqueue.Request{})
		assert.NoError(t, err)
		got <- p
	}()
	select {
	case p := <-got:
		if p != nil {
			defer p.Release()
		}
		t.Fatalf("a third request ran beside the 2 local permits on 2 permits (local %v; Redis holders %v)",
			p != nil && p.Local(), readState(t, n.rdb, name).Holders)
	case <-time.After(time.Second):
	}

	// The adoption lands: the request waits for a permit to end.
	openGate()
	eventually(t, 10*time.Second, func() bool { return len(readState(t, n.rdb, name).Holders) == 2 }, "local permits never adopted")
	select {
	case p := <-got:
		t.Fatalf("a third request ran beside the 2 adopted local permits (local %v)", p != nil && p.Local())
	case <-time.After(300 * time.Millisecond):
	}
	l1.Release()
	select {
	case p := <-got:
		require.NotNil(t, p)
		assert.False(t, p.Local(), "served by the fallback queue after the store came back")
		p.Release()
	case <-time.After(10 * time.Second):
		t.Fatal("the waiting request was never served")
	}
	l2.Release()
}

// heldAcquire holds, once armed, the next acquire call until open is
// closed: a call on its way when Redis went away, that the client's
// retries carry to Redis once it is back.
type heldAcquire struct {
	fairqueue.Store
	armed   atomic.Bool
	entered chan struct{}
	open    chan struct{}
}

func (h *heldAcquire) Acquire(ctx context.Context, args fairqueue.TicketArgs) (fairqueue.AcquireResult, error) {
	if !h.armed.CompareAndSwap(true, false) {
		return h.Store.Acquire(ctx, args)
	}
	close(h.entered)
	<-h.open
	cctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return h.Store.Acquire(cctx, args)
}

// Local fallback, recovery: an acquire call on its way through the
// outage reaches the restarted Redis before the heartbeat that adopts
// the local permits: Redis grants it, counting none of them. The
// request waits for them rather than run beside them.
func TestLocalFallbackAcquireAnsweredBeforeTheAdoptionWaitsForTheLocalPermits(t *testing.T) {
	srv := redistest.Start(t)
	const name = "adoptlate"
	h := &heldAdoption{entered: make(chan struct{}), open: make(chan struct{})}
	a := &heldAcquire{entered: make(chan struct{}), open: make(chan struct{})}
	var opened, aOpened sync.Once
	openGate := func() { opened.Do(func() { close(h.open) }) }
	openAcquire := func() { aOpened.Do(func() { close(a.open) }) }
	n := wrappedNode(t, srv, name, fairqueue.Config{Permits: 2, LocalPermits: 2, Fallback: memstore.New(),
		Lease: 30 * time.Second, PollInterval: 50 * time.Millisecond, MaxWait: 20 * time.Second},
		func(s fairqueue.Store) fairqueue.Store { a.Store = s; h.Store = a; return h })
	h.up = func() bool { return n.q.Stats().StoreUp }
	t.Cleanup(func() { openGate(); openAcquire() }) // before the node closes
	p, err := n.q.Acquire(context.Background(), fairqueue.Request{})
	require.NoError(t, err)
	p.Release()

	// A request's acquire call is on its way; Redis goes away.
	a.armed.Store(true)
	got := make(chan *fairqueue.Permit, 1)
	go func() {
		p, err := n.q.Acquire(context.Background(), fairqueue.Request{})
		assert.NoError(t, err)
		got <- p
	}()
	<-a.entered
	srv.Kill()
	l1, l2 := takeLocal(t, n.q), takeLocal(t, n.q)
	h.armed.Store(true)
	srv.Restart()
	eventually(t, 10*time.Second, func() bool { return n.q.Stats().StoreUp }, "store never back up")
	select {
	case <-h.entered:
	case <-time.After(10 * time.Second):
		t.Fatal("no heartbeat adopted the local permits")
	}

	// The call reaches Redis, which counts none of the local permits.
	openAcquire()
	select {
	case p := <-got:
		if p != nil {
			defer p.Release()
		}
		t.Fatalf("a third request ran beside the 2 local permits on 2 permits (local %v; Redis holders %v)",
			p != nil && p.Local(), readState(t, n.rdb, name).Holders)
	case <-time.After(time.Second):
	}

	openGate()
	eventually(t, 10*time.Second, func() bool { return len(readState(t, n.rdb, name).Holders) == 2 }, "local permits never adopted")
	// The heartbeat's answer retires the fallback queue after Redis
	// counts the adopted permits: its waiter then waits in Redis.
	eventually(t, 10*time.Second, func() bool { return len(readState(t, n.rdb, name).Waiting) == 1 },
		"the request never moved to the shared queue")
	l1.Release()
	select {
	case p := <-got:
		require.NotNil(t, p)
		assert.False(t, p.Local(), "served by the fallback queue after the store came back")
		p.Release()
	case <-time.After(10 * time.Second):
		t.Fatal("the waiting request was never served")
	}
	l2.Release()
}

// Local fallback, recovery: a permit the fallback queue gives while the
// heartbeat that adopts the local permits is on its way is not among
// those it names. Redis counts it before the node sends its requests to
// the shared queue, or one granted there would run beside it until the
// node's next heartbeat (a third of the lease later).
func TestLocalPermitGivenWhileTheAdoptionIsOnItsWayIsCountedBeforeTheSharedQueueServes(t *testing.T) {
	t.Parallel() // its own redis-server: it waits on it, not on the CPU
	// Redis keeps its data over the restart (a short outage): the node
	// is not forgotten, and no heartbeat follows the adoption at once.
	srv := redistest.Start(t, redistest.WithArgs("--appendonly", "yes"))
	const name = "adoptmissed"
	h := &heldAdoption{entered: make(chan struct{}), open: make(chan struct{})}
	var opened sync.Once
	openGate := func() { opened.Do(func() { close(h.open) }) }
	n := wrappedNode(t, srv, name, fairqueue.Config{Permits: 2, LocalPermits: 2, Fallback: memstore.New(),
		Lease: 30 * time.Second, PollInterval: 50 * time.Millisecond, MaxWait: 20 * time.Second},
		func(s fairqueue.Store) fairqueue.Store { h.Store = s; return h })
	h.up = func() bool { return n.q.Stats().StoreUp }
	t.Cleanup(openGate) // before the node closes: its loop may wait here
	p, err := n.q.Acquire(context.Background(), fairqueue.Request{})
	require.NoError(t, err)
	p.Release()
	// A heartbeat found the node: it is a member, not one rejoining.
	eventually(t, 10*time.Second, func() bool { return n.q.Stats().Cluster.Nodes == 1 }, "no heartbeat")

	srv.Stop()
	l1, l2 := takeLocal(t, n.q), takeLocal(t, n.q)
	acquire := func() chan *fairqueue.Permit {
		got := make(chan *fairqueue.Permit, 1)
		go func() {
			p, err := n.q.Acquire(context.Background(), fairqueue.Request{})
			assert.NoError(t, err)
			got <- p
		}()
		return got
	}
	gotW := acquire() // waits in the fallback queue
	eventually(t, 10*time.Second, func() bool { return n.q.Stats().Waiting == 1 }, "no waiter in the fallback queue")
	h.armed.Store(true)
	srv.Restart()
	eventually(t, 10*time.Second, func() bool { return n.q.Stats().StoreUp }, "store never back up")
	select {
	case <-h.entered:
	case <-time.After(10 * time.Second):
		t.Fatal("no heartbeat adopted the local permits")
	}

	// The adoption names l1 and l2; l1 ends, and the fallback queue
	// gives its permit to the waiter.
	l1.Release()
	var w *fairqueue.Permit
	select {
	case w = <-gotW:
		require.NotNil(t, w)
		require.True(t, w.Local(), "the waiter was not served by the fallback queue")
		defer w.Release()
	case <-time.After(10 * time.Second):
		t.Fatal("the fallback queue's waiter was never served")
	}
	openGate()
	eventually(t, 10*time.Second, func() bool {
		hs := readState(t, n.rdb, name).Holders
		return slices.Contains(hs, l2.Ticket()) && !slices.Contains(hs, l1.Ticket())
	}, "local permits never adopted")

	// l2 and the waiter's permit run: a new request waits.
	gotN := acquire()
	select {
	case p := <-gotN:
		if p != nil {
			defer p.Release()
		}
		t.Fatalf("a request ran beside the 2 local permits on 2 permits (local %v; Redis holders %v)",
			p != nil && p.Local(), readState(t, n.rdb, name).Holders)
	case <-time.After(time.Second):
	}
	l2.Release()
	select {
	case p := <-gotN:
		require.NotNil(t, p)
		assert.False(t, p.Local(), "served by the fallback queue after the store came back")
		p.Release()
	case <-time.After(10 * time.Second):
		t.Fatal("the waiting request was never served")
	}
}
