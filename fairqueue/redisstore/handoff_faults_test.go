package redisstore_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
	"github.com/fair-queue/caddy-fair-queue/fairqueue/redisstore"
	"github.com/fair-queue/caddy-fair-queue/internal/redistest"
)

// The local handoff where the store's view and the node's differ (see
// fairqueue/handoff.go).

type got struct {
	p   *fairqueue.Permit
	err error
}

// queueWaiter starts an Acquire on n and waits until Redis has one more
// waiter; it returns the channel of its result and its ticket.
func queueWaiter(t *testing.T, n *node, name string) (chan got, string) {
	t.Helper()
	before := readState(t, n.rdb, name).Waiting
	ch := make(chan got, 1)
	go func() {
		p, err := n.q.Acquire(context.Background(), fairqueue.Request{})
		ch <- got{p, err}
	}()
	var id string
	eventually(t, 5*time.Second, func() bool {
		w := readState(t, n.rdb, name).Waiting
		if len(w) != len(before)+1 {
			return false
		}
		id = w[len(w)-1]
		return true
	}, "waiter queued")
	return ch, id
}

// alive waits for the node's heartbeat that confirms it: the first one
// after joining reports it (re)joined, and the one it kicks at once
// confirms it; local handoffs may start then.
func alive(t *testing.T, n *node) {
	t.Helper()
	eventually(t, 5*time.Second, func() bool { return n.q.Stats().Cluster.Nodes > 0 }, "a heartbeat")
	time.Sleep(500 * time.Millisecond)
}

// secondInLine makes n (1 permit) hold a permit with two waiters behind
// it, confirmed alive, and releases it through Redis (its reply names the
// second waiter as the head): it returns the first waiter, granted, and
// the second, whose handoff comes next.
func secondInLine(t *testing.T, n *node, name string) (w1 got, w2 chan got, w2id string) {
	t.Helper()
	h, err := n.q.Acquire(context.Background(), fairqueue.Request{})
	require.NoError(t, err)
	w1Ch, _ := queueWaiter(t, n, name)
	w2, w2id = queueWaiter(t, n, name)
	alive(t, n)
	h.Release()
	w1 = <-w1Ch
	require.NoError(t, w1.err)
	return w1, w2, w2id
}

// A lowered permits setting holds at once: while more permits are held
// than it allows, releases hand on through Redis, which grants nobody
// until the count is under it (the transfer alone would keep the old
// concurrency: it swaps a holder for a waiter).
func TestLocalHandoffKeepsToLoweredPermits(t *testing.T) {
	srv := redistest.Start(t)
	cfg := fairqueue.Config{Permits: 3, MaxWait: 10 * time.Second, Lease: 3 * time.Second}
	n := newNode(t, srv, "lowered", cfg)
	var held []*fairqueue.Permit
	for range 3 {
		p, err := n.q.Acquire(context.Background(), fairqueue.Request{})
		require.NoError(t, err)
		held = append(held, p)
	}
	var ws []chan got
	for range 3 {
		ch, _ := queueWaiter(t, n, "lowered")
		ws = append(ws, ch)
	}
	alive(t, n)
	cfg.Permits = 1
	require.NoError(t, n.q.Reconfigure(cfg))
	for _, p := range held {
		p.Release() // one by one
	}
	time.Sleep(300 * time.Millisecond)
	running := 0
	for _, ch := range ws {
		select {
		case r := <-ch:
			require.NoError(t, r.err)
			running++
		default:
		}
	}
	t.Logf("holders in Redis: %v", readState(t, n.rdb, "lowered").Holders)
	assert.LessOrEqual(t, running, 1, "permits are 1 now, yet %d requests run", running)
}

// A waiter the store lost (a failover) and the node queued again is at
// the tail: named as the head before the loss, it is not handed the
// next permit ahead of an older waiter.
func TestLocalHandoffPassesNobodyOverAfterTheStoreLostAWaiter(t *testing.T) {
	srv := redistest.Start(t)
	cfg := fairqueue.Config{Permits: 1, MaxWait: 10 * time.Second, Lease: 3 * time.Second}
	n1 := newNode(t, srv, "stale", cfg)
	n2 := newNode(t, srv, "stale", cfg)
	ctx := context.Background()
	h, err := n1.q.Acquire(ctx, fairqueue.Request{})
	require.NoError(t, err)
	aCh, _ := queueWaiter(t, n1, "stale")
	xCh, x := queueWaiter(t, n1, "stale")
	alive(t, n1)
	h.Release() // plain: grants A, the reply names X as n1's head
	a := <-aCh
	require.NoError(t, a.err)
	yCh, y := queueWaiter(t, n2, "stale")
	// A failover that lost X's entry; the new subscription resyncs n1,
	// whose heartbeat finds X missing and queues it again: behind Y.
	tag := redisstore.New(n1.rdb, "stale", redisstore.Options{}).Tag()
	require.NoError(t, n1.rdb.ZRem(ctx, tag+":waiting", x).Err())
	n1.q.Resynced()
	eventually(t, 5*time.Second, func() bool {
		w := readState(t, n1.rdb, "stale").Waiting
		return len(w) == 2 && w[0] == y && w[1] == x
	}, "X queued again behind Y")
	a.p.Release()
	select {
	case r := <-xCh:
		t.Errorf("X (now behind Y) was granted first: %v", r.err)
		if r.p != nil {
			r.p.Release()
		}
	case r := <-yCh:
		require.NoError(t, r.err)
		r.p.Release()
	case <-time.After(5 * time.Second):
		t.Fatal("nobody granted")
	}
}

// Close waits for a transfer on its way: run after the node left, it
// would write a holder entry that nobody renews or releases (the
// waiter's own release is skipped on a closed queue).
func TestCloseWaitsForATransferOnItsWay(t *testing.T) {
	srv := redistest.Start(t)
	ht := &heldTransfers{calls: make(chan string, 8), go_: make(chan struct{})}
	cfg := fairqueue.Config{Permits: 1, MaxWait: 10 * time.Second, Lease: 3 * time.Second}
	n1 := wrappedNode(t, srv, "closing", cfg, func(s fairqueue.Store) fairqueue.Store { ht.Store = s; return ht })
	w1, w2Ch, w2 := secondInLine(t, n1, "closing")
	go w1.p.Release() // local handoff to W2; its transfer is held
	select {
	case <-ht.calls:
	case <-time.After(5 * time.Second):
		t.Fatal("no local handoff")
	}
	r2 := <-w2Ch
	require.NoError(t, r2.err)
	closed := make(chan struct{})
	go func() { _ = n1.q.Close(); close(closed) }()
	select { // without a wait for the transfer, leave runs first
	case <-closed:
	case <-time.After(time.Second):
	}
	ht.go_ <- struct{}{}
	<-closed
	time.Sleep(200 * time.Millisecond)
	r2.p.Release()
	time.Sleep(200 * time.Millisecond)
	st := readState(t, n1.rdb, "closing")
	assert.Empty(t, st.Nodes)
	assert.NotContains(t, st.Holders, w2, "a holder of a node that left")
}

// lostTransfer fails every Transfer without running it; the test runs
// it later, as a script that reached Redis after its call timed out.
type lostTransfer struct {
	fairqueue.Store
	mu   sync.Mutex
	args []fairqueue.TicketArgs
	to   []string
}

func (l *lostTransfer) Transfer(ctx context.Context, t fairqueue.TicketArgs, to string) error {
	l.mu.Lock()
	l.args, l.to = append(l.args, t), append(l.to, to)
	l.mu.Unlock()
	return errors.New("i/o timeout")
}

// A transfer that runs late, after its call failed (its reply lost) and
// after its waiter's request ended, leaves a ghost holder: the node
// reconciles for a while after a failed transfer and releases it,
// instead of leaving the permit lost to everybody for a lease.
func TestALateTransferLeavesNoGhostHolder(t *testing.T) {
	srv := redistest.Start(t)
	lt := &lostTransfer{}
	cfg := fairqueue.Config{Permits: 1, MaxWait: 20 * time.Second, Lease: 10 * time.Second}
	n1 := wrappedNode(t, srv, "late", cfg, func(s fairqueue.Store) fairqueue.Store { lt.Store = s; return lt })
	n2 := newNode(t, srv, "late", cfg)
	ctx := context.Background()
	w1, w2Ch, _ := secondInLine(t, n1, "late")
	w1.p.Release() // local handoff to W2; the transfer "times out"; W1 released plainly
	w2 := <-w2Ch
	require.NoError(t, w2.err)
	eventually(t, 5*time.Second, func() bool {
		hs := readState(t, n1.rdb, "late").Holders
		return len(hs) == 1 && hs[0] == w2.p.Ticket()
	}, "W1's release granted W2 in Redis")
	w2.p.Release()
	eventually(t, 5*time.Second, func() bool { return len(readState(t, n1.rdb, "late").Holders) == 0 }, "W2 released")
	// The transfer reaches Redis now; its reply is lost (a store without
	// a handler stands for the client that gave up).
	lt.mu.Lock()
	args, to := lt.args[0], lt.to[0]
	lt.mu.Unlock()
	require.NoError(t, redisstore.New(n1.rdb, "late", redisstore.Options{}).Transfer(ctx, args, to))
	start := time.Now()
	ctx2, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	p, err := n2.q.Acquire(ctx2, fairqueue.Request{})
	t.Logf("holders: %v", readState(t, n1.rdb, "late").Holders)
	require.NoError(t, err, "nothing runs, yet the one permit is held by a ghost (waited %s)", time.Since(start))
	p.Release()
}

// gatedRelease holds the first Release until open is closed: a release
// whose reply reaches the node after a reload.
type gatedRelease struct {
	fairqueue.Store
	once    sync.Once
	entered chan struct{}
	open    chan struct{}
}

func (g *gatedRelease) Release(ctx context.Context, t fairqueue.TicketArgs) error {
	first := false
	g.once.Do(func() { first = true })
	if first {
		close(g.entered)
		<-g.open
	}
	return g.Store.Release(ctx, t)
}

func (g *gatedRelease) Transfer(ctx context.Context, t fairqueue.TicketArgs, to string) error {
	return g.Store.(fairqueue.Transferrer).Transfer(ctx, t, to)
}

// A release sent under the old permits whose reply, naming the node's
// waiter as the head, arrives after permits were lowered: that head was
// chosen under the old setting, and the next release may not hand its
// permit on to it (a transfer keeps the old concurrency).
func TestLocalHandoffIgnoresAHeadNamedUnderHigherPermits(t *testing.T) {
	srv := redistest.Start(t)
	cfg := fairqueue.Config{Permits: 2, MaxWait: 10 * time.Second, Lease: 3 * time.Second}
	g := &gatedRelease{entered: make(chan struct{}), open: make(chan struct{})}
	n := wrappedNode(t, srv, "late", cfg, func(s fairqueue.Store) fairqueue.Store { g.Store = s; return g })
	ctx := context.Background()
	h1, err := n.q.Acquire(ctx, fairqueue.Request{})
	require.NoError(t, err)
	h2, err := n.q.Acquire(ctx, fairqueue.Request{})
	require.NoError(t, err)
	w1Ch, _ := queueWaiter(t, n, "late")
	xCh, _ := queueWaiter(t, n, "late")
	alive(t, n)

	released := make(chan struct{})
	go func() { h1.Release(); close(released) }()
	<-g.entered // the release is on its way under permits 2
	cfg.Permits = 1
	require.NoError(t, n.q.Reconfigure(cfg))
	close(g.open)
	<-released
	// Computed under permits 2: W1 granted, X named as the head.
	w1 := <-w1Ch
	require.NoError(t, w1.err)
	defer w1.p.Release()

	h2.Release()
	select {
	case x := <-xCh:
		if x.err == nil {
			x.p.Release()
		}
		t.Fatalf("X started on h2's permit: %d requests ran with permits 1 (holders in Redis: %v)",
			2, readState(t, n.rdb, "late").Holders)
	case <-time.After(300 * time.Millisecond):
	}
	assert.Len(t, readState(t, n.rdb, "late").Holders, 1, "W1 alone holds a permit")
}
