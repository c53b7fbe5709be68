package redisstore_test

import (
	"context"
	"errors"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
	"github.com/fair-queue/caddy-fair-queue/fairqueue/memstore"
	"github.com/fair-queue/caddy-fair-queue/fairqueue/redisstore"
	"github.com/fair-queue/caddy-fair-queue/internal/redistest"
)

// The promises of issue "keep every promise under faults", one test each:
// the upstream never runs more than the permits (outside the documented
// windows), every waiter is answered, nothing is left behind.

func holderExpiry(t *testing.T, rdb *redis.Client, name, ticket string) time.Duration {
	t.Helper()
	tag := redisstore.New(rdb, name, redisstore.Options{}).Tag()
	score, err := rdb.ZScore(context.Background(), tag+":holders", ticket).Result()
	require.NoError(t, err, "ticket %s holds no permit", ticket)
	now, err := rdb.Time(context.Background()).Result()
	require.NoError(t, err)
	return time.Duration(int64(score)-now.UnixMilli()) * time.Millisecond
}

// During a rolling change of lease, a permit one node's release hands to
// another node's waiter lasts the owner's lease: the owner renews on its
// own (longer) schedule, so a lease written by the granter would end
// while the request runs and its permit would go to a second request.
func TestGrantToAnotherNodesWaiterLastsTheOwnersLease(t *testing.T) {
	srv := redistest.Start(t)
	short := newNode(t, srv, "roll", fairqueue.Config{Permits: 1, Lease: time.Second, PollInterval: 50 * time.Millisecond, MaxWait: 10 * time.Second})
	long := newNode(t, srv, "roll", fairqueue.Config{Permits: 1, Lease: 30 * time.Second, PollInterval: 50 * time.Millisecond, MaxWait: 10 * time.Second})
	p, err := short.q.Acquire(context.Background(), fairqueue.Request{})
	require.NoError(t, err)
	waiter := acquireAsync(long, context.Background())
	eventually(t, 5*time.Second, func() bool { return len(readState(t, short.rdb, "roll").Waiting) == 1 }, "the long-lease node's request never queued")
	p.Release() // the short-lease node's release script grants the long-lease waiter
	got := <-waiter
	require.NoError(t, got.err)
	defer got.p.Release()
	assert.Greater(t, holderExpiry(t, short.rdb, "roll", got.p.Ticket()), 20*time.Second, "granted with the granter's lease")

	// Past the short lease, with the owner's next renewal 10 s away, the
	// permit is still held: the short-lease node's request waits.
	time.Sleep(1500 * time.Millisecond)
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	_, err = short.q.Acquire(ctx, fairqueue.Request{})
	require.ErrorIs(t, err, context.DeadlineExceeded, "a second request ran beside the first with 1 permit")
}

// A lease changed by a reload takes effect at once: the node heartbeats
// with the new lease instead of waiting a third of it, so permits held
// under a shorter lease do not end before their first renewal.
func TestLongerLeaseRenewsHeldPermitsAtOnce(t *testing.T) {
	srv := redistest.Start(t)
	cfg := fairqueue.Config{Permits: 1, Lease: 1200 * time.Millisecond, PollInterval: 50 * time.Millisecond, MaxWait: 10 * time.Second}
	n := newNode(t, srv, "release", cfg)
	p, err := n.q.Acquire(context.Background(), fairqueue.Request{})
	require.NoError(t, err)
	defer p.Release()
	time.Sleep(300 * time.Millisecond) // the node's first heartbeats ran: the next is lease/3 away
	cfg.Lease = 30 * time.Second
	require.NoError(t, n.q.Reconfigure(cfg))
	eventually(t, 3*time.Second, func() bool { return holderExpiry(t, n.rdb, "release", p.Ticket()) > 20*time.Second },
		"the held permit kept the old lease's expiry")
}

// Redis can forget a node and its waiters while the node runs (a
// partition longer than the lease: its waiters were dropped at the head).
// A request of that node reaching Redis first makes the node alive again;
// its heartbeat must still find the lost waiter and queue it again,
// instead of letting it wait out max_wait with permits free.
func TestWaiterForgottenByRedisIsQueuedAgainAfterAnAcquireRevivedTheNode(t *testing.T) {
	srv := redistest.Start(t)
	cfg := fairqueue.Config{Permits: 1, Lease: 1200 * time.Millisecond, PollInterval: 50 * time.Millisecond, MaxWait: 8 * time.Second}
	holder := newNode(t, srv, "forgot", cfg)
	a := newNode(t, srv, "forgot", cfg)
	p, err := holder.q.Acquire(context.Background(), fairqueue.Request{})
	require.NoError(t, err)
	lost := acquireAsync(a, context.Background())
	eventually(t, 5*time.Second, func() bool { return len(readState(t, a.rdb, "forgot").Waiting) == 1 }, "the request never queued")

	// Redis forgets a: its liveness and its waiter go, as when its waiter
	// reached the head while a was partitioned away.
	tag := redisstore.New(a.rdb, "forgot", redisstore.Options{}).Tag()
	ctx := context.Background()
	require.NoError(t, a.rdb.Del(ctx, tag+":waiting").Err())
	require.NoError(t, a.rdb.ZRem(ctx, tag+":nodes", a.q.Node()).Err())
	second := acquireAsync(a, context.Background()) // reaches Redis first: a is alive again
	eventually(t, 5*time.Second, func() bool { return slices.Contains(readState(t, a.rdb, "forgot").Nodes, a.q.Node()) },
		"the second request never reached Redis")

	p.Release()
	serveBoth(t, lost, second)
}

// serveBoth waits for two acquires in either order, releasing each permit.
func serveBoth(t *testing.T, a, b <-chan acquired) {
	t.Helper()
	for range 2 {
		var got acquired
		select {
		case got = <-a:
			a = nil
		case got = <-b:
			b = nil
		case <-time.After(6 * time.Second):
			t.Fatal("a waiter was never served")
		}
		require.NoError(t, got.err, "a waiter was not served with permits free")
		got.p.Release()
	}
}

// A failover that loses the last enqueues keeps the node alive in Redis:
// nothing says the node was forgotten. Its new subscription (the old
// connection broke) makes the node check its waiters and queue again the
// ones Redis lost.
func TestWaiterLostInAFailoverIsQueuedAgainAfterTheResubscription(t *testing.T) {
	srv := redistest.Start(t)
	cfg := fairqueue.Config{Permits: 1, Lease: 30 * time.Second, PollInterval: 50 * time.Millisecond, MaxWait: 8 * time.Second}
	holder := newNode(t, srv, "failover", cfg)
	a := newNode(t, srv, "failover", cfg)
	p, err := holder.q.Acquire(context.Background(), fairqueue.Request{})
	require.NoError(t, err)
	lost := acquireAsync(a, context.Background())
	eventually(t, 5*time.Second, func() bool { return len(readState(t, a.rdb, "failover").Waiting) == 1 }, "the request never queued")
	tag := redisstore.New(a.rdb, "failover", redisstore.Options{}).Tag()
	require.NoError(t, a.rdb.Del(context.Background(), tag+":waiting").Err()) // the lost write
	require.NoError(t, a.rdb.ClientKillByFilter(context.Background(), "TYPE", "pubsub").Err())

	eventually(t, 5*time.Second, func() bool { return len(readState(t, a.rdb, "failover").Waiting) == 1 },
		"the lost waiter was never queued again")
	p.Release()
	select {
	case got := <-lost:
		require.NoError(t, got.err)
		got.p.Release()
	case <-time.After(5 * time.Second):
		t.Fatal("the waiter Redis lost was never served")
	}
}

// A waiter queued again after Redis lost it was admitted once: the queue
// cap, full meanwhile with others' requests, does not turn it away (it
// would wait out max_wait with no entry in the queue).
func TestLostWaiterIsQueuedAgainBeyondAFullCap(t *testing.T) {
	srv := redistest.Start(t)
	cfg := fairqueue.Config{Permits: 1, MaxQueue: 1, Lease: 1200 * time.Millisecond, PollInterval: 50 * time.Millisecond, MaxWait: 8 * time.Second}
	holder := newNode(t, srv, "capped", cfg)
	a := newNode(t, srv, "capped", cfg)
	b := newNode(t, srv, "capped", cfg)
	p, err := holder.q.Acquire(context.Background(), fairqueue.Request{})
	require.NoError(t, err)
	lost := acquireAsync(a, context.Background())
	eventually(t, 5*time.Second, func() bool { return len(readState(t, a.rdb, "capped").Waiting) == 1 }, "the request never queued")
	tag := redisstore.New(a.rdb, "capped", redisstore.Options{}).Tag()
	ctx := context.Background()
	require.NoError(t, a.rdb.Del(ctx, tag+":waiting").Err())
	require.NoError(t, a.rdb.ZRem(ctx, tag+":nodes", a.q.Node()).Err())
	other := acquireAsync(b, context.Background()) // fills the cap
	eventually(t, 5*time.Second, func() bool { return len(readState(t, a.rdb, "capped").Waiting) >= 1 }, "b never queued")

	eventually(t, 5*time.Second, func() bool { return len(readState(t, a.rdb, "capped").Waiting) == 2 },
		"the lost waiter was not queued again")
	p.Release()
	serveBoth(t, other, lost)
}

// heartbeatHook runs before forwarding a node's heartbeat; retry sends the
// heartbeat twice and answers with the second run, as go-redis does after
// a read timeout.
type heartbeatHook struct {
	fairqueue.Store
	before func(hb fairqueue.HeartbeatArgs) bool // true: this heartbeat is re-sent
}

func (s *heartbeatHook) Heartbeat(ctx context.Context, hb fairqueue.HeartbeatArgs) (fairqueue.HeartbeatResult, error) {
	if s.before != nil && s.before(hb) {
		if _, err := s.Store.Heartbeat(ctx, hb); err != nil {
			return fairqueue.HeartbeatResult{}, err
		}
	}
	return s.Store.Heartbeat(ctx, hb)
}

// A heartbeat re-sent by the client after it counted again a permit
// released while it was on its way reports nothing the second time; the
// node must still release that permit, or it is held for nobody until
// its lease ends.
func TestPermitReleasedDuringARetriedHeartbeatIsNotLeftHeld(t *testing.T) {
	srv := redistest.Start(t)
	var p atomic.Pointer[fairqueue.Permit]
	var seen atomic.Int32
	released := make(chan struct{})
	hook := &heartbeatHook{}
	hook.before = func(hb fairqueue.HeartbeatArgs) bool {
		// The second heartbeat naming the permit: the first may be the
		// node's join, which re-adds nothing.
		cur := p.Load()
		if cur == nil || !slices.Contains(hb.Held, cur.Ticket()) || seen.Add(1) != 2 {
			return false
		}
		cur.Release() // released while the heartbeat is on its way
		close(released)
		return true
	}
	// A 3 s lease (renewed every second): the permit must go well before
	// it would end on its own.
	n := wrappedNode(t, srv, "retried", fairqueue.Config{Permits: 1, Lease: 3 * time.Second, PollInterval: 50 * time.Millisecond, MaxWait: 5 * time.Second},
		func(s fairqueue.Store) fairqueue.Store { hook.Store = s; return hook })
	got, err := n.q.Acquire(context.Background(), fairqueue.Request{})
	require.NoError(t, err)
	p.Store(got)
	select {
	case <-released:
	case <-time.After(10 * time.Second):
		t.Fatal("the node never heartbeated twice")
	}
	eventually(t, time.Second, func() bool { return len(readState(t, n.rdb, "retried").Holders) == 0 },
		"the released permit is held for nobody")
}

// failing makes every Acquire fail without reaching the store while on.
type failing struct {
	fairqueue.Store
	on atomic.Bool
}

func (s *failing) Acquire(ctx context.Context, t fairqueue.TicketArgs) (fairqueue.AcquireResult, error) {
	if s.on.Load() {
		return fairqueue.AcquireResult{}, errors.New("unreachable")
	}
	return s.Store.Acquire(ctx, t)
}

// A fail-open permit released while the heartbeat that registers it
// (adopts it) is on its way must not stay registered for nobody.
func TestFailOpenPermitReleasedDuringItsAdoptionIsNotLeftHeld(t *testing.T) {
	srv := redistest.Start(t)
	f := &failing{}
	f.on.Store(true)
	var p atomic.Pointer[fairqueue.Permit]
	hook := &heartbeatHook{}
	var adopted atomic.Bool
	hook.before = func(hb fairqueue.HeartbeatArgs) bool {
		if cur := p.Load(); cur != nil && slices.Contains(hb.Adopt, cur.Ticket()) && adopted.CompareAndSwap(false, true) {
			cur.Release()
		}
		return false
	}
	n := wrappedNode(t, srv, "adopt", fairqueue.Config{Permits: 1, FailOpen: true, Lease: 30 * time.Second, PollInterval: 50 * time.Millisecond, MaxWait: 5 * time.Second},
		func(s fairqueue.Store) fairqueue.Store { f.Store = s; hook.Store = f; return hook })
	got, err := n.q.Acquire(context.Background(), fairqueue.Request{})
	require.NoError(t, err)
	require.True(t, got.FailOpen())
	p.Store(got)
	f.on.Store(false)
	eventually(t, 5*time.Second, adopted.Load, "the fail-open permit was never adopted")
	eventually(t, 3*time.Second, func() bool { return len(readState(t, n.rdb, "adopt").Holders) == 0 },
		"the released fail-open permit is held for nobody")
}

// slowCancel delays cancels, as a loaded Redis or network would.
type slowCancel struct {
	fairqueue.Store
	lostAcquire atomic.Bool // acquires run but their answers are lost
}

func (s *slowCancel) Acquire(ctx context.Context, t fairqueue.TicketArgs) (fairqueue.AcquireResult, error) {
	res, err := s.Store.Acquire(ctx, t)
	if err == nil && s.lostAcquire.Load() {
		return fairqueue.AcquireResult{}, context.DeadlineExceeded
	}
	return res, err
}

func (s *slowCancel) Cancel(ctx context.Context, t fairqueue.TicketArgs) error {
	time.Sleep(300 * time.Millisecond)
	return s.Store.Cancel(ctx, t)
}

// A lost acquire's cancel runs in the background; when the node is the
// last to leave, that cancel runs before the leave deletes the queue's
// keys, so it cannot create its tombstone again afterwards.
func TestShutdownWaitsForBackgroundCancelsBeforeLeaving(t *testing.T) {
	srv := redistest.Start(t)
	s := &slowCancel{}
	n := wrappedNode(t, srv, "bgcancel", fairqueue.Config{Permits: 1, MaxWait: 2 * time.Second},
		func(st fairqueue.Store) fairqueue.Store { s.Store = st; return s })
	p, err := n.q.Acquire(context.Background(), fairqueue.Request{})
	require.NoError(t, err)
	p.Release()
	s.lostAcquire.Store(true)
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	_, err = n.q.Acquire(ctx, fairqueue.Request{}) // its answers are lost: cancelled with a tombstone in the background
	require.Error(t, err)
	require.NoError(t, n.q.Close())
	assert.Empty(t, srv.Keys(t, "*"), "keys left after the last node left")
}

// On shutdown every waiter is answered at once, those of the local
// fallback queue (on_store_error local) too.
func TestRejectWaitersAnswersTheFallbackQueuesWaiters(t *testing.T) {
	srv := redistest.Start(t)
	f := &failing{}
	f.on.Store(true)
	n := wrappedNode(t, srv, "fallback", fairqueue.Config{Permits: 4, LocalPermits: 1, Fallback: memstore.New(), MaxWait: 20 * time.Second},
		func(s fairqueue.Store) fairqueue.Store { f.Store = s; return f })
	p, err := n.q.Acquire(context.Background(), fairqueue.Request{})
	require.NoError(t, err)
	require.True(t, p.Local())
	defer p.Release()
	waiter := acquireAsync(n, context.Background())
	time.Sleep(200 * time.Millisecond) // it waits in the fallback queue
	n.q.RejectWaiters()
	select {
	case got := <-waiter:
		require.ErrorIs(t, got.err, fairqueue.ErrShuttingDown)
	case <-time.After(5 * time.Second):
		t.Fatal("a waiter of the fallback queue was not answered on shutdown")
	}
}

// reacquireHook runs before forwarding an acquire of a ticket already
// acquired once (the requeue of a waiter Redis lost).
type reacquireHook struct {
	fairqueue.Store
	seen   sync.Map
	before func(t fairqueue.TicketArgs)
}

func (s *reacquireHook) Acquire(ctx context.Context, t fairqueue.TicketArgs) (fairqueue.AcquireResult, error) {
	if _, again := s.seen.LoadOrStore(t.ID, true); again && s.before != nil {
		s.before(t)
	}
	return s.Store.Acquire(ctx, t)
}

// A lost waiter whose client leaves while its requeue is on the way is
// not left in the queue for nobody: its own cancel may reach Redis first.
func TestWaiterThatLeavesDuringItsRequeueIsNotLeftQueued(t *testing.T) {
	srv := redistest.Start(t)
	cfg := fairqueue.Config{Permits: 1, Lease: 30 * time.Second, PollInterval: 50 * time.Millisecond, MaxWait: 8 * time.Second}
	holder := newNode(t, srv, "leaving", cfg)
	p, err := holder.q.Acquire(context.Background(), fairqueue.Request{})
	require.NoError(t, err)
	defer p.Release()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var lost <-chan acquired
	hook := &reacquireHook{}
	hook.before = func(fairqueue.TicketArgs) {
		cancel() // the client leaves; its cancel reaches Redis before this acquire
		<-lost
	}
	var a *node
	a = wrappedNode(t, srv, "leaving", cfg, func(s fairqueue.Store) fairqueue.Store { hook.Store = s; return hook })
	lost = acquireAsync(a, ctx)
	eventually(t, 5*time.Second, func() bool { return len(readState(t, a.rdb, "leaving").Waiting) == 1 }, "the request never queued")
	tag := redisstore.New(a.rdb, "leaving", redisstore.Options{}).Tag()
	require.NoError(t, a.rdb.Del(context.Background(), tag+":waiting").Err())
	require.NoError(t, a.rdb.ClientKillByFilter(context.Background(), "TYPE", "pubsub").Err())
	eventually(t, 5*time.Second, func() bool { return ctx.Err() != nil }, "the lost waiter was never queued again")
	time.Sleep(300 * time.Millisecond)
	eventually(t, 2*time.Second, func() bool { return len(readState(t, a.rdb, "leaving").Waiting) == 0 },
		"a waiter that left is queued for nobody")
}

// However many waiters an instance has, the heartbeat names them in calls
// of a bounded size, and every one Redis lost is queued again.
func TestManyLostWaitersAreAllQueuedAgain(t *testing.T) {
	const waiters = 2500 // more than one heartbeat call names
	srv := redistest.Start(t)
	cfg := fairqueue.Config{Permits: 1, Lease: 30 * time.Second, PollInterval: 50 * time.Millisecond, MaxWait: 20 * time.Second}
	holder := newNode(t, srv, "many", cfg)
	a := newNode(t, srv, "many", cfg)
	p, err := holder.q.Acquire(context.Background(), fairqueue.Request{})
	require.NoError(t, err)
	defer p.Release()
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	t.Cleanup(func() { cancel(); wg.Wait() })
	tag := redisstore.New(a.rdb, "many", redisstore.Options{}).Tag()
	card := func() int64 { return a.rdb.ZCard(context.Background(), tag+":waiting").Val() }
	// In batches: thousands of acquires at once would wait for the
	// client's connections past its timeouts on a loaded machine, and be
	// refused, which is not what this test is about.
	const batch = 100
	for n := batch; n <= waiters; n += batch {
		for range batch {
			wg.Go(func() { _, _ = a.q.Acquire(ctx, fairqueue.Request{}) })
		}
		eventually(t, 20*time.Second, func() bool { return card() == int64(n) }, "the requests never queued")
	}
	require.NoError(t, a.rdb.Del(context.Background(), tag+":waiting").Err())
	require.NoError(t, a.rdb.ClientKillByFilter(context.Background(), "TYPE", "pubsub").Err())
	eventually(t, 30*time.Second, func() bool { return card() == waiters }, "lost waiters were not all queued again")
}
