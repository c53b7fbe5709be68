package redisstore_test

import (
	"context"
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

type acquired struct {
	p   *fairqueue.Permit
	err error
	at  time.Time
}

func acquireAsync(n *node, ctx context.Context) <-chan acquired {
	ch := make(chan acquired, 1)
	go func() {
		p, err := n.q.Acquire(ctx, fairqueue.Request{})
		ch <- acquired{p, err, time.Now()}
	}()
	return ch
}

// A node that dies holding permits (no release, no heartbeat) gives them
// back when their lease ends, and its waiters leave the queue.
func TestCrashedNodesPermitsReturnAfterLease(t *testing.T) {
	srv := redistest.Start(t)
	cfg := fairqueue.Config{Permits: 1, Lease: time.Second, PollInterval: 50 * time.Millisecond, MaxWait: 20 * time.Second}
	dead := newNode(t, srv, "crash", cfg)
	live := newNode(t, srv, "crash", cfg)
	_, err := dead.q.Acquire(context.Background(), fairqueue.Request{})
	require.NoError(t, err)
	deadWaiter := acquireAsync(dead, context.Background())
	eventually(t, 2*time.Second, func() bool { return len(readState(t, live.rdb, "crash").Waiting) == 1 }, "dead node's waiter not queued")
	liveWaiter := acquireAsync(live, context.Background())
	eventually(t, 2*time.Second, func() bool { return len(readState(t, live.rdb, "crash").Waiting) == 2 }, "live waiter not queued")

	crashed := time.Now()
	require.NoError(t, dead.rdb.Close()) // the node can no longer say anything

	select {
	case r := <-liveWaiter:
		require.NoError(t, r.err)
		wait := r.at.Sub(crashed)
		t.Logf("permit back %s after the crash (lease 1s)", wait)
		assert.Less(t, wait, 4*time.Second)
		eventually(t, 3*time.Second, func() bool { return live.q.Stats().Cluster.LeaseExpirations == 1 },
			"the expired lease is counted in the cluster view")
		r.p.Release()
	case <-time.After(6 * time.Second):
		t.Fatal("crashed node's permit never came back")
	}
	st := readState(t, live.rdb, "crash")
	assert.Empty(t, st.Waiting, "the dead node's waiter was dropped")
	assert.Empty(t, st.Holders)
	_ = deadWaiter
}

// dropGrants wraps a store and loses the first n grant notifications,
// as Pub/Sub does while a subscriber reconnects.
type dropGrants struct {
	fairqueue.Store
	n atomic.Int32
}

type dropListener struct {
	fairqueue.Listener
	d *dropGrants
}

func (h dropListener) Granted(gs ...fairqueue.Grant) {
	if h.d.n.Add(-1) >= 0 {
		return
	}
	h.Listener.Granted(gs...)
}

func (d *dropGrants) Open(ctx context.Context, node string, h fairqueue.Listener) error {
	return d.Store.Open(ctx, node, dropListener{h, d})
}

func TestLostGrantMessageIsFoundByReconcile(t *testing.T) {
	srv := redistest.Start(t)
	rdb := srv.Client(t)
	store := &dropGrants{Store: redisstore.New(rdb, "lost", redisstore.Options{})}
	store.n.Store(1)
	q, err := fairqueue.New(store, fairqueue.Config{Name: "lost", Permits: 1, PollInterval: 100 * time.Millisecond})
	require.NoError(t, err)
	defer q.Close()
	holder, err := q.Acquire(context.Background(), fairqueue.Request{})
	require.NoError(t, err)
	waiter := acquireAsync(&node{q: q}, context.Background())
	eventually(t, 2*time.Second, func() bool { return len(readState(t, rdb, "lost").Waiting) == 1 }, "not queued")
	released := time.Now()
	holder.Release()
	r := <-waiter
	require.NoError(t, r.err)
	assert.Equal(t, int32(0), store.n.Load(), "the grant message was dropped")
	t.Logf("granted %s after release without its message (poll 100ms)", r.at.Sub(released))
	assert.Less(t, r.at.Sub(released), time.Second)
	r.p.Release()
}

func TestKilledSubscriptionStillGetsGrant(t *testing.T) {
	srv := redistest.Start(t)
	cfg := fairqueue.Config{Permits: 1, PollInterval: 100 * time.Millisecond}
	a := newNode(t, srv, "kill", cfg)
	b := newNode(t, srv, "kill", cfg)
	p, err := a.q.Acquire(context.Background(), fairqueue.Request{})
	require.NoError(t, err)
	waiter := acquireAsync(b, context.Background())
	eventually(t, 2*time.Second, func() bool { return len(readState(t, a.rdb, "kill").Waiting) == 1 }, "not queued")
	admin := srv.Client(t)
	require.NoError(t, admin.Do(context.Background(), "CLIENT", "KILL", "TYPE", "pubsub").Err())
	released := time.Now()
	p.Release()
	r := <-waiter
	require.NoError(t, r.err)
	t.Logf("granted %s after release with the subscriber killed", r.at.Sub(released))
	assert.Less(t, r.at.Sub(released), 2*time.Second)
	r.p.Release()
}

// Redis restarts empty while permits are held: within one heartbeat the
// nodes re-register their live holders and re-queue their waiters; from
// then on the permits hold again.
func TestRedisDataLossRecovers(t *testing.T) {
	srv := redistest.Start(t)
	cfg := fairqueue.Config{Permits: 2, Lease: 1500 * time.Millisecond, PollInterval: 50 * time.Millisecond, MaxWait: 5 * time.Second}
	a := newNode(t, srv, "loss", cfg)
	b := newNode(t, srv, "loss", cfg)
	var held []*fairqueue.Permit
	for range 2 {
		p, err := a.q.Acquire(context.Background(), fairqueue.Request{})
		require.NoError(t, err)
		held = append(held, p)
	}
	waiter := acquireAsync(b, context.Background())
	eventually(t, 2*time.Second, func() bool { return len(readState(t, a.rdb, "loss").Waiting) == 1 }, "not queued")

	srv.Restart()
	// Window: until a's heartbeat (every lease/3 = 500ms) re-adds its two
	// holders, b's re-queued waiter may be granted on top of them.
	// b's waiter is queued again, or granted if b noticed the loss before
	// a re-registered its permits (the documented window).
	eventually(t, 5*time.Second, func() bool {
		st := readState(t, a.rdb, "loss")
		return slices.Contains(st.Holders, held[0].Ticket()) && slices.Contains(st.Holders, held[1].Ticket()) &&
			len(st.Holders)+len(st.Waiting) == 3
	}, "holders never re-registered, or b's waiter lost, after data loss")
	for _, p := range held {
		p.Release()
	}
	r := <-waiter
	require.NoError(t, r.err, "b's waiter is served after recovery")
	r.p.Release()

	// After recovery the permits hold under load again.
	var inside, maxInside atomic.Int32
	var wg sync.WaitGroup
	for i := range 40 {
		wg.Add(1)
		go func(n *node) {
			defer wg.Done()
			p, err := n.q.Acquire(context.Background(), fairqueue.Request{})
			if !assert.NoError(t, err) {
				return
			}
			c := inside.Add(1)
			if c > maxInside.Load() {
				maxInside.Store(c)
			}
			time.Sleep(2 * time.Millisecond)
			inside.Add(-1)
			p.Release()
		}([]*node{a, b}[i%2])
	}
	wg.Wait()
	assert.LessOrEqual(t, maxInside.Load(), int32(2))
	st := readState(t, a.rdb, "loss")
	assert.Empty(t, st.Waiting)
	assert.Empty(t, st.Holders)
}

// go-redis re-sends a script after a lost answer: running each one twice
// with the same ticket must leave the same state as running it once.
func TestScriptsAreIdempotentByTicket(t *testing.T) {
	rdb, s := openStore(t, "idem")
	ctx := context.Background()
	l := fairqueue.Limits{Permits: 1, Lease: 10 * time.Second}
	t1 := fairqueue.TicketArgs{ID: "n1:1", Node: "n1", Limits: l}
	t2 := fairqueue.TicketArgs{ID: "n1:2", Node: "n1", Limits: l}
	dump := func() string {
		st := readState(t, rdb, "idem")
		seq, _ := rdb.Get(ctx, s.Tag()+":seq").Result()
		grants, _ := rdb.Get(ctx, s.Tag()+":grants").Result()
		return stateString(st) + " seq=" + seq + " grants=" + grants
	}
	twice := func(name string, f func() error) {
		require.NoError(t, f(), name)
		once := dump()
		require.NoError(t, f(), name+" again")
		assert.Equal(t, once, dump(), "%s run twice", name)
	}
	twice("acquire granted", func() error { _, err := s.Acquire(ctx, t1); return err })
	twice("acquire queued", func() error {
		r, err := s.Acquire(ctx, t2)
		assert.False(t, r.Granted)
		assert.Equal(t, 1, r.Position)
		return err
	})
	twice("heartbeat", func() error {
		_, err := s.Heartbeat(ctx, fairqueue.HeartbeatArgs{Node: "n1", Limits: l, Held: []string{"n1:1"}})
		return err
	})
	twice("release", func() error { return s.Release(ctx, t1) }) // hands the permit to n1:2
	assert.Equal(t, []string{"n1:2"}, readState(t, rdb, "idem").Holders)
	t3 := fairqueue.TicketArgs{ID: "n1:3", Node: "n1", Limits: l, Tombstone: true}
	twice("cancel with tombstone", func() error { return s.Cancel(ctx, t3) })
	r, err := s.Acquire(ctx, t3)
	require.NoError(t, err)
	assert.True(t, r.Gone, "an acquire after its cancel does nothing")
	twice("cancel of a holder", func() error { return s.Cancel(ctx, t2) })
	twice("reconcile", func() error { _, err := s.Reconcile(ctx, "n1", l); return err })
	twice("leave", func() error { return s.Leave(ctx, "n1", l) })
	keys, err := rdb.Keys(ctx, s.Tag()+"*").Result()
	require.NoError(t, err)
	assert.Empty(t, keys, "the last node's leave deletes everything")
}

type nopListener struct{}

func (nopListener) Granted(...fairqueue.Grant) {}
func (nopListener) Resynced()                  {}

func stateString(st queueState) string {
	return "waiting=" + join(st.Waiting) + " holders=" + join(st.Holders) + " nodes=" + join(st.Nodes)
}

func join(s []string) string {
	out := ""
	for _, x := range s {
		out += x + ","
	}
	return out
}

var _ = redis.Nil

// A frozen Redis (SIGSTOP: connections open, no answers) must not hold a
// request past its max wait, and a dead one fails fast with the typed
// error once the store is marked down.
func TestFrozenOrDeadRedisNeverBlocksPastMaxWait(t *testing.T) {
	srv := redistest.Start(t)
	n := newNode(t, srv, "frozen", fairqueue.Config{Permits: 1, MaxWait: time.Second, PollInterval: 50 * time.Millisecond})
	p, err := n.q.Acquire(context.Background(), fairqueue.Request{})
	require.NoError(t, err)
	p.Release()

	srv.Freeze()
	start := time.Now()
	_, err = n.q.Acquire(context.Background(), fairqueue.Request{})
	took := time.Since(start)
	srv.Thaw()
	require.Error(t, err)
	t.Logf("frozen: %v after %s", err, took)
	assert.Less(t, took, 2500*time.Millisecond, "max wait 1s + one bounded cancel")
	r := fairqueue.ReasonOf(err)
	assert.Contains(t, []fairqueue.Reason{fairqueue.ReasonTimeout, fairqueue.ReasonStoreUnavailable}, r)

	srv.Kill()
	for i := range 3 {
		start = time.Now()
		_, err = n.q.Acquire(context.Background(), fairqueue.Request{})
		assert.ErrorIs(t, err, fairqueue.ErrStoreUnavailable, "attempt %d", i)
		assert.Less(t, time.Since(start), 1500*time.Millisecond)
	}
	eventually(t, 3*time.Second, func() bool { return !n.q.Stats().StoreUp }, "store never marked down")
	start = time.Now()
	_, err = n.q.Acquire(context.Background(), fairqueue.Request{})
	assert.ErrorIs(t, err, fairqueue.ErrStoreUnavailable)
	assert.Less(t, time.Since(start), 50*time.Millisecond, "a down store answers at once")

	srv.Restart()
	eventually(t, 3*time.Second, func() bool { return n.q.Stats().StoreUp }, "store never marked up again")
	p, err = n.q.Acquire(context.Background(), fairqueue.Request{})
	require.NoError(t, err)
	p.Release()
}

// Fail open: while Redis is away requests are admitted without a permit;
// when it returns the heartbeat registers them as holders, so the queue
// counts them against the permits until they end.
func TestFailOpenPermitsAreAdoptedWhenRedisReturns(t *testing.T) {
	srv := redistest.Start(t)
	n := newNode(t, srv, "open", fairqueue.Config{Permits: 1, FailOpen: true, Lease: 1500 * time.Millisecond, PollInterval: 50 * time.Millisecond})
	p, err := n.q.Acquire(context.Background(), fairqueue.Request{})
	require.NoError(t, err)
	p.Release()
	srv.Kill()
	p, err = n.q.Acquire(context.Background(), fairqueue.Request{})
	require.NoError(t, err)
	assert.True(t, p.FailOpen())
	srv.Restart()
	// Adopted, and the node has seen Redis back: the heartbeat that
	// adopts runs in Redis before its answer marks the store up, and a
	// request in between is still admitted without a permit (fail open).
	eventually(t, 5*time.Second, func() bool {
		return len(readState(t, n.rdb, "open").Holders) == 1 && n.q.Stats().StoreUp
	}, "fail-open permit never adopted as a holder")
	waiter := acquireAsync(n, context.Background())
	eventually(t, 2*time.Second, func() bool { return len(readState(t, n.rdb, "open").Waiting) == 1 }, "the adopted permit does not count")
	p.Release()
	r := <-waiter
	require.NoError(t, r.err)
	assert.False(t, r.p.FailOpen())
	r.p.Release()
	assert.Empty(t, readState(t, n.rdb, "open").Holders)
}

// Local fallback: while Redis is away each node queues alone with its
// local permits; the upstream sees at most local permits per node, and
// requests beyond them wait (they are not admitted as with fail open).
func TestLocalFallbackQueuesInTheNodeWhileRedisIsAway(t *testing.T) {
	srv := redistest.Start(t)
	n := newNode(t, srv, "local", fairqueue.Config{Permits: 4, LocalPermits: 2, Fallback: memstore.New(),
		Lease: 1500 * time.Millisecond, PollInterval: 50 * time.Millisecond, MaxWait: 10 * time.Second})
	p, err := n.q.Acquire(context.Background(), fairqueue.Request{})
	require.NoError(t, err)
	p.Release()
	srv.Kill()
	var inside, maxInside atomic.Int32
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			p, err := n.q.Acquire(context.Background(), fairqueue.Request{})
			if !assert.NoError(t, err) {
				return
			}
			assert.True(t, p.Local())
			c := inside.Add(1)
			for m := maxInside.Load(); c > m && !maxInside.CompareAndSwap(m, c); m = maxInside.Load() {
			}
			time.Sleep(50 * time.Millisecond)
			inside.Add(-1)
			p.Release()
		}()
	}
	wg.Wait()
	assert.Equal(t, int32(2), maxInside.Load(), "local permits hold while Redis is away")
	srv.Restart()
	eventually(t, 5*time.Second, func() bool { return n.q.Stats().StoreUp }, "store never back up")
	// The shared queue is used again once a heartbeat has counted the
	// local permits running there (none here): at the node's next poll.
	eventually(t, 5*time.Second, func() bool {
		p, err := n.q.Acquire(context.Background(), fairqueue.Request{})
		require.NoError(t, err)
		defer p.Release()
		return !p.Local()
	}, "the shared queue is never used again")
}

// A busy client pool (this process overloaded, Redis fine) is not an
// outage: the acquire is sent again until a connection frees, and no
// request is admitted without a permit (fail open) meanwhile.
func TestBusyClientPoolIsNotAnOutage(t *testing.T) {
	srv := redistest.Start(t)
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr(), PoolSize: 1, PoolTimeout: 20 * time.Millisecond,
		ReadTimeout: 2 * time.Second, ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = rdb.Close() })
	q, err := fairqueue.New(redisstore.New(rdb, "busy", redisstore.Options{}),
		fairqueue.Config{Name: "busy", Permits: 1, FailOpen: true, MaxWait: 5 * time.Second})
	require.NoError(t, err)
	t.Cleanup(func() { _ = q.Close() })
	p, err := q.Acquire(context.Background(), fairqueue.Request{})
	require.NoError(t, err)
	p.Release()

	blocked := make(chan struct{})
	go func() { // holds the only pooled connection for 600ms
		close(blocked)
		rdb.BLPop(context.Background(), 600*time.Millisecond, "{busy}:nothing")
	}()
	<-blocked
	time.Sleep(50 * time.Millisecond)
	start := time.Now()
	p, err = q.Acquire(context.Background(), fairqueue.Request{})
	require.NoError(t, err)
	t.Logf("granted after %s with the pool busy", time.Since(start))
	assert.False(t, p.FailOpen(), "a busy pool must not admit without a permit")
	assert.True(t, q.Stats().StoreUp, "a busy pool does not mark the store down")
	assert.Equal(t, []string{p.Ticket()}, readState(t, srv.Client(t), "busy").Holders)
	p.Release()
}

// A failover that loses the last writes keeps the epoch key (written long
// before) but may lose a grant: the holder entry of a request that runs.
// The owner's next heartbeat counts it again, so no waiter is granted on
// top of it for longer than one heartbeat interval.
func TestGrantLostWithTheEpochKeptIsCountedAgain(t *testing.T) {
	srv := redistest.Start(t)
	cfg := fairqueue.Config{Permits: 1, Lease: 1200 * time.Millisecond, PollInterval: 50 * time.Millisecond, MaxWait: 5 * time.Second}
	a := newNode(t, srv, "lostgrant", cfg)
	p, err := a.q.Acquire(context.Background(), fairqueue.Request{})
	require.NoError(t, err)
	defer p.Release()

	// The lost write: the holder entry is gone, the epoch is not.
	tag := redisstore.New(a.rdb, "lostgrant", redisstore.Options{}).Tag()
	require.NoError(t, a.rdb.ZRem(context.Background(), tag+":holders", p.Ticket()).Err())
	require.NotEmpty(t, a.rdb.Get(context.Background(), tag+":epoch").Val())

	eventually(t, 5*time.Second, func() bool {
		return slices.Contains(readState(t, a.rdb, "lostgrant").Holders, p.Ticket())
	}, "the running request's permit was never counted again")

	// Counted again, the permit is held: another node's request waits.
	b := newNode(t, srv, "lostgrant", cfg)
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	_, err = b.q.Acquire(ctx, fairqueue.Request{})
	require.ErrorIs(t, err, context.DeadlineExceeded, "granted on top of the running request")
}
