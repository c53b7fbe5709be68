package redisstore_test

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
	"github.com/fair-queue/caddy-fair-queue/internal/redistest"
)

// A node whose queue never joined (Redis down at its first request)
// joins in the background once Redis is back, with no request. On
// on_store_error local, its fallback queue's running permits are
// counted in Redis (adopted) before Redis grants anything beside them,
// and its waiters move into Redis in their order: the first released
// permit goes to the first waiter, and a request of another node that
// came after them waits behind both.
func TestNeverJoinedNodeAdoptsLocalPermitsAndMovesWaitersInOrderWithoutRequests(t *testing.T) {
	srv := redistest.Start(t)
	const name = "rejoin-adopt"
	cfg := fairqueue.Config{Permits: 2, Fallback: memstore.New(), Lease: 30 * time.Second,
		PollInterval: 50 * time.Millisecond, MaxWait: 30 * time.Second}
	srv.Stop()
	a := newNode(t, srv, name, cfg)
	l1, l2 := takeLocal(t, a.q), takeLocal(t, a.q)
	require.False(t, a.q.Stats().StoreUp, "down from the failed join")

	type result struct {
		i int
		p *fairqueue.Permit
	}
	got := make(chan result, 3)
	for i := range 2 {
		go func() {
			p, err := a.q.Acquire(context.Background(), fairqueue.Request{})
			assert.NoError(t, err)
			got <- result{i, p}
		}()
		eventually(t, 10*time.Second, func() bool { return a.q.Stats().Waiting == i+1 }, "waiter %d never queued", i)
	}

	srv.Restart()
	// No request: the background join finds Redis, and the loop's
	// heartbeat counts the two local permits.
	eventually(t, 20*time.Second, func() bool { return a.q.Stats().StoreUp }, "never read up again")
	eventually(t, 20*time.Second, func() bool { return len(readState(t, a.rdb, name).Holders) == 2 },
		"the running local permits were never adopted: holders %v", readState(t, a.rdb, name).Holders)
	// The waiters move into Redis, in their order.
	eventually(t, 20*time.Second, func() bool { return len(readState(t, a.rdb, name).Waiting) == 2 },
		"the fallback queue's waiters never moved into Redis: %+v", readState(t, a.rdb, name))

	b := newNode(t, srv, name, cfg)
	fromB := make(chan *fairqueue.Permit, 1)
	go func() {
		p, err := b.q.Acquire(context.Background(), fairqueue.Request{})
		assert.NoError(t, err)
		fromB <- p
	}()
	eventually(t, 10*time.Second, func() bool { return len(readState(t, a.rdb, name).Waiting) == 3 },
		"the other node's request never queued (granted beside 2 adopted permits?)")
	select {
	case r := <-got:
		t.Fatalf("waiter %d ran beside the 2 running local permits on 2 permits (local %v)", r.i, r.p.Local())
	case p := <-fromB:
		t.Fatalf("the other node's request ran beside the 2 running local permits (local %v)", p.Local())
	case <-time.After(300 * time.Millisecond):
	}

	l1.Release()
	var first result
	select {
	case first = <-got:
	case <-time.After(10 * time.Second):
		t.Fatal("no waiter served after a local permit ended")
	}
	assert.Equal(t, 0, first.i, "the fallback queue's second waiter went first")
	assert.False(t, first.p.Local())
	l2.Release()
	var second result
	select {
	case second = <-got:
	case p := <-fromB:
		p.Release()
		t.Fatal("the other node's later request went before the fallback queue's second waiter")
	case <-time.After(10 * time.Second):
		t.Fatal("the second waiter never served")
	}
	assert.Equal(t, 1, second.i)
	first.p.Release()
	select {
	case p := <-fromB:
		p.Release()
	case <-time.After(10 * time.Second):
		t.Fatal("the other node's request never served")
	}
	second.p.Release()

	require.NoError(t, a.q.Close())
	require.NoError(t, b.q.Close())
	assert.Empty(t, srv.Keys(t, "*"), "keys left after the last node left")
}

// fail_open: permits admitted while the node never joined are counted
// in Redis once the background join succeeds, with no request, and
// uncounted once they end.
func TestNeverJoinedNodeRegistersFailOpenPermitsWithoutRequests(t *testing.T) {
	srv := redistest.Start(t)
	const name = "rejoin-failopen"
	srv.Stop()
	a := newNode(t, srv, name, fairqueue.Config{Permits: 1, FailOpen: true, Lease: 30 * time.Second,
		PollInterval: 50 * time.Millisecond, MaxWait: 10 * time.Second})
	p, err := a.q.Acquire(context.Background(), fairqueue.Request{})
	require.NoError(t, err)
	require.True(t, p.FailOpen())
	srv.Restart()
	eventually(t, 20*time.Second, func() bool { return len(readState(t, a.rdb, name).Holders) == 1 },
		"the fail-open permit was never registered: %+v", readState(t, a.rdb, name))
	p.Release()
	eventually(t, 20*time.Second, func() bool { return len(readState(t, a.rdb, name).Holders) == 0 },
		"the fail-open permit stayed counted after it ended")
	require.NoError(t, a.q.Close())
	assert.Empty(t, srv.Keys(t, "*"), "keys left after the node left")
}

// heldOpen fails every Open while fail is set, and holds, once armed,
// the next Open until open is closed (Redis slow to answer a join).
type heldOpen struct {
	fairqueue.Store
	fail    atomic.Bool
	armed   atomic.Bool
	opens   atomic.Int32 // Open calls
	joined  atomic.Int32 // Open calls that succeeded
	entered chan struct{}
	open    chan struct{}
}

func (h *heldOpen) Open(ctx context.Context, node string, l fairqueue.Listener) error {
	h.opens.Add(1)
	if h.fail.Load() {
		return errAdoptionHeld
	}
	if h.armed.CompareAndSwap(true, false) {
		close(h.entered)
		<-h.open
	}
	err := h.Store.Open(ctx, node, l)
	if err == nil {
		h.joined.Add(1)
	}
	return err
}

func heldOpenNode(t *testing.T, srv *redistest.Server, name string, cfg fairqueue.Config) (*node, *heldOpen, func()) {
	h := &heldOpen{entered: make(chan struct{}), open: make(chan struct{})}
	h.fail.Store(true)
	var once sync.Once
	release := func() { once.Do(func() { close(h.open) }) }
	n := wrappedNode(t, srv, name, cfg, func(s fairqueue.Store) fairqueue.Store { h.Store = s; return h })
	t.Cleanup(release) // before the node closes
	return n, h, release
}

// backgroundJoinHeld starts a node of queue name (max wait maxWait)
// whose first join fails and whose background join, the next, is held
// (heldOpen) until release, and returns once that join is on its way.
func backgroundJoinHeld(t *testing.T, srv *redistest.Server, name string, maxWait time.Duration) (*node, *heldOpen, func()) {
	t.Helper()
	n, h, release := heldOpenNode(t, srv, name, fairqueue.Config{Permits: 1, Lease: 30 * time.Second,
		PollInterval: 50 * time.Millisecond, MaxWait: maxWait})
	_, err := n.q.Acquire(context.Background(), fairqueue.Request{})
	require.Error(t, err, "fail_closed while the join fails")
	h.armed.Store(true)
	h.fail.Store(false)
	select {
	case <-h.entered:
	case <-time.After(10 * time.Second):
		t.Fatal("no background join")
	}
	return n, h, release
}

// requestWhileJoinHeld starts a node of queue name whose first join
// fails and whose background join, the next, is held (heldOpen) until
// release, and sends a request once that join is on its way: its
// answer comes on answered (nil: served).
func requestWhileJoinHeld(t *testing.T, name string) (*node, *heldOpen, func(), <-chan error) {
	t.Helper()
	n, h, release := backgroundJoinHeld(t, redistest.Start(t), name, time.Minute)
	answered := make(chan error, 1)
	go func() {
		p, err := n.q.Acquire(context.Background(), fairqueue.Request{})
		if p != nil {
			p.Release()
		}
		answered <- err
	}()
	return n, h, release, answered
}

// Close while the background join is on its way: the join that lands
// then is left again (no key stays in Redis), and no join runs after
// Close returned.
func TestCloseWhileTheBackgroundJoinIsOnItsWayLeavesNoKey(t *testing.T) {
	srv := redistest.Start(t)
	n, h, release := backgroundJoinHeld(t, srv, "rejoin-close", 5*time.Second)
	closed := make(chan error, 1)
	go func() { closed <- n.q.Close() }()
	time.Sleep(100 * time.Millisecond) // Close on its way, waiting for the join
	release()
	select {
	case err := <-closed:
		require.NoError(t, err)
	case <-time.After(20 * time.Second):
		t.Fatal("Close never returned")
	}
	assert.Empty(t, srv.Keys(t, "*"), "keys left after the node left")
	opens := h.opens.Load()
	time.Sleep(2500 * time.Millisecond) // more than two background tries
	assert.Equal(t, opens, h.opens.Load(), "a join tried after Close")
	assert.Empty(t, srv.Keys(t, "*"), "keys written after the node left")
}

// A request that comes while the background join is on its way is
// answered by on_store_error at once (the store reads down from the
// failed join), not after that join: with Redis hanging (a frozen
// Redis, dropped SYNs), the join takes the store's timeout, and the
// background one runs nearly always.
func TestRequestIsAnsweredAtOnceWhileTheBackgroundJoinIsOnItsWay(t *testing.T) {
	n, h, release, answered := requestWhileJoinHeld(t, "rejoin-inflight")
	select {
	case err := <-answered:
		var re *fairqueue.RejectError
		require.ErrorAs(t, err, &re)
		assert.Equal(t, fairqueue.ReasonStoreUnavailable, re.Reason)
	case <-time.After(10 * time.Second):
		release()
		<-answered
		t.Fatal("the request waited for the background join (10 s and more) rather than being answered by on_store_error")
	}
	release()
	eventually(t, 20*time.Second, func() bool { return n.q.Stats().StoreUp }, "never joined")
	p, err := n.q.Acquire(context.Background(), fairqueue.Request{})
	require.NoError(t, err)
	p.Release()
	assert.Equal(t, int32(1), h.joined.Load(), "opens that succeeded")
}

// A request that comes while a join is on its way to a store that
// answers again (the join lands within a few ms) is served by it, not
// answered by on_store_error with the failed join's error: a request
// waits for a join on its way up to a short bound (50 ms), only a join
// to a store that hangs is left to run alone (above).
func TestRequestWhileAJoinThatSucceedsIsOnItsWayIsServed(t *testing.T) {
	_, _, release, answered := requestWhileJoinHeld(t, "rejoin-lands")
	time.Sleep(5 * time.Millisecond)
	release()
	select {
	case err := <-answered:
		require.NoError(t, err, "a request refused while the join that served it was landing")
	case <-time.After(10 * time.Second):
		t.Fatal("the request was never answered")
	}
}
