package redisstore_test

import (
	"context"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
	"github.com/fair-queue/caddy-fair-queue/fairqueue/redisstore"
	"github.com/fair-queue/caddy-fair-queue/internal/redistest"
)

// holdScript holds the next call of its client named one of names
// (lower case; default: a script), once armed, until release is closed;
// held receives the time it was held. The held call then goes on
// whether or not its context ended meanwhile; ran is closed once it
// did.
type holdScript struct {
	armed   atomic.Bool
	names   []string
	held    chan time.Time
	release chan struct{}
	ran     chan struct{}
}

func newHoldScript(names ...string) *holdScript {
	if len(names) == 0 {
		names = []string{"evalsha", "eval"}
	}
	return &holdScript{names: names, held: make(chan time.Time, 1), release: make(chan struct{}), ran: make(chan struct{})}
}

func (h *holdScript) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *holdScript) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

func (h *holdScript) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if slices.Contains(h.names, cmd.Name()) && h.armed.CompareAndSwap(true, false) {
			h.held <- time.Now()
			<-h.release
			defer close(h.ran)
			return next(context.WithoutCancel(ctx), cmd)
		}
		return next(ctx, cmd)
	}
}

// Two instances of one queue leave at about the same time (a Caddy that
// stops with a retired queue and its successor over the same keys, or
// two nodes): A's leave starts, B names the queue in the registry
// (its Open here; a heartbeat's every 10 s alike) and leaves first, and
// A's leave reaches Redis only then, the last: it deletes the queue's
// keys. The registry must not name the queue after that: nothing is
// left, and with no other queue under the prefix nothing would ever
// sweep the name. (Failed before the fix: the leave took out only a
// name registered before it started, and B's came a millisecond later:
// "Should be empty, but was [{fair_queue}:queues]".)
func TestTheLastLeaveTakesOutANameRegisteredWhileItWasOnItsWay(t *testing.T) {
	ctx := context.Background()
	srv := redistest.Start(t)
	bounded := func(o *redis.Options) { o.ContextTimeoutEnabled = true } // as Caddy's clients
	ca, cb := srv.Client(t, bounded), srv.Client(t, bounded)
	hold := newHoldScript()
	ca.AddHook(hold)
	l := fairqueue.Limits{Permits: 1, Lease: 20 * time.Second}

	a := redisstore.New(ca, "q", redisstore.Options{})
	require.NoError(t, a.Open(ctx, "a", nopListener{}))
	t.Cleanup(func() { _ = a.Close() })
	_, err := a.Heartbeat(ctx, fairqueue.HeartbeatArgs{Node: "a", Limits: l, Beat: 1})
	require.NoError(t, err)

	hold.armed.Store(true)
	left := make(chan error, 1)
	go func() { left <- a.Leave(ctx, "a", l) }()
	var heldAt time.Time
	select {
	case heldAt = <-hold.held:
	case <-time.After(10 * time.Second):
		t.Fatal("A's leave sent no script")
	}
	// B names the queue a millisecond later than A's leave started.
	eventually(t, 5*time.Second, func() bool { return time.Now().UnixMilli() > heldAt.UnixMilli() }, "the clock stands still")
	b := redisstore.New(cb, "q", redisstore.Options{})
	require.NoError(t, b.Open(ctx, "b", nopListener{}))
	_, err = b.Heartbeat(ctx, fairqueue.HeartbeatArgs{Node: "b", Limits: l, Beat: 1})
	require.NoError(t, err)
	require.NoError(t, b.Leave(ctx, "b", l))
	require.NoError(t, b.Close())
	require.NotEmpty(t, srv.Keys(t, redisstore.TagOf("", "q")+"*"), "B's leave, not the last, deleted the queue")

	close(hold.release)
	select {
	case err = <-left:
		require.NoError(t, err)
	case <-time.After(10 * time.Second):
		t.Fatal("A's leave did not end")
	}
	assert.Empty(t, srv.Keys(t, "*"), "keys left after the last leave")
}

// An instance that opens the queue after the last leave deleted its keys
// names it in the registry, and keeps that name.
func TestAQueueOpenedAfterTheLastLeaveIsNamed(t *testing.T) {
	ctx := context.Background()
	srv := redistest.Start(t)
	rdb := srv.Client(t)
	l := fairqueue.Limits{Permits: 1, Lease: 20 * time.Second}
	a := redisstore.New(rdb, "q", redisstore.Options{})
	require.NoError(t, a.Open(ctx, "a", nopListener{}))
	_, err := a.Heartbeat(ctx, fairqueue.HeartbeatArgs{Node: "a", Limits: l, Beat: 1})
	require.NoError(t, err)
	require.NoError(t, a.Leave(ctx, "a", l))
	require.NoError(t, a.Close())
	require.Empty(t, srv.Keys(t, "*"))

	b := redisstore.New(rdb, "q", redisstore.Options{})
	require.NoError(t, b.Open(ctx, "b", nopListener{}))
	t.Cleanup(func() { _ = b.Close() })
	names, err := rdb.ZRange(ctx, redisstore.RegistryKey(""), 0, -1).Result()
	require.NoError(t, err)
	assert.Equal(t, []string{"q"}, names, "the registry")
}

// An instance opens the queue (naming it in the registry) just before
// another instance's last leave deletes the queue's keys and takes the
// name out; its first request then writes the keys again. Its first
// heartbeat names the queue again: a queue with keys and no name would
// never be swept if its instances all crashed. (A node's first
// heartbeat answers Rejoined, which names the queue.)
func TestTheFirstHeartbeatNamesAQueueWhoseNameALeaveTookOut(t *testing.T) {
	ctx := context.Background()
	srv := redistest.Start(t)
	rdb := srv.Client(t)
	l := fairqueue.Limits{Permits: 1, Lease: 20 * time.Second}
	a := redisstore.New(rdb, "q", redisstore.Options{})
	require.NoError(t, a.Open(ctx, "a", nopListener{}))
	t.Cleanup(func() { _ = a.Close() })
	_, err := a.Heartbeat(ctx, fairqueue.HeartbeatArgs{Node: "a", Limits: l, Beat: 1})
	require.NoError(t, err)

	b := redisstore.New(rdb, "q", redisstore.Options{})
	require.NoError(t, b.Open(ctx, "b", nopListener{}))
	t.Cleanup(func() { _ = b.Close() })
	eventually(t, 5*time.Second, func() bool {
		s, err := rdb.ZScore(ctx, redisstore.RegistryKey(""), "q").Result()
		return err == nil && time.Now().UnixMilli() > int64(s)
	}, "the clock stands still")
	require.NoError(t, a.Leave(ctx, "a", l)) // the last: B has not joined yet
	names := func() []string {
		n, err := rdb.ZRange(ctx, redisstore.RegistryKey(""), 0, -1).Result()
		require.NoError(t, err)
		return n
	}
	require.Empty(t, names(), "the registry after A's leave")

	r, err := b.Acquire(ctx, fairqueue.TicketArgs{ID: "b:1", Node: "b", Limits: l, Cost: 1})
	require.NoError(t, err)
	require.True(t, r.Granted)
	_, err = b.Heartbeat(ctx, fairqueue.HeartbeatArgs{Node: "b", Limits: l, Beat: 1, Held: []string{"b:1"}, Epoch: r.Epoch})
	require.NoError(t, err)
	assert.Equal(t, []string{"q"}, names(), "the registry after B's first heartbeat")
	require.NoError(t, b.Leave(ctx, "b", l))
	assert.Empty(t, srv.Keys(t, "*"), "keys left after the last leave")
}

// A store on a client that does not end its calls at their deadline
// (go-redis' default: the store bounds them itself) names the queue at
// its first heartbeat; that call outlives the heartbeat's context and
// reaches Redis only after the store's leave, the last, deleted the keys
// and took the name out. The name must not stay: nothing of the queue is
// left. The hook lets the held register go on without its context's end, as
// a call written to its connection before the end that Redis runs late
// (go-redis sends nothing once the context ended). (Failed before the
// fix: the late register brought the name back for good, "keys left after
// the last leave: [{fair_queue}:queues]".)
func TestARegisterRunAfterTheLastLeaveLeavesNoNameForGood(t *testing.T) {
	ctx := context.Background()
	srv := redistest.Start(t)
	rdb := srv.Client(t) // ContextTimeoutEnabled off: calls bounded by the store
	hold := newHoldRegistry()
	rdb.AddHook(hold)
	l := fairqueue.Limits{Permits: 1, Lease: 20 * time.Second}
	s := redisstore.New(rdb, "q", redisstore.Options{})
	require.NoError(t, s.Open(ctx, "a", nopListener{}))
	t.Cleanup(func() { _ = s.Close() })

	heartbeatRegisterHeld(t, s, hold, l)
	require.NoError(t, s.Leave(ctx, "a", l))
	close(hold.release) // the register reaches Redis now
	select {
	case <-hold.ran:
	case <-time.After(10 * time.Second):
		t.Fatal("the held register did not run")
	}
	eventually(t, 10*time.Second, func() bool { return len(srv.Keys(t, "*")) == 0 },
		"keys left after the last leave: %v", srv.Keys(t, "*"))
}

// heartbeatRegisterHeld runs s's first heartbeat (of node "a", under l)
// with its register held by hold, and cuts the heartbeat's context: the
// heartbeat ends, its register still on its way (until hold.release).
func heartbeatRegisterHeld(t *testing.T, s *redisstore.Store, hold *holdRegistry, l fairqueue.Limits) {
	t.Helper()
	hold.armed.Store(true)
	hctx, cancel := context.WithCancel(context.Background())
	beat := make(chan error, 1)
	go func() {
		_, err := s.Heartbeat(hctx, fairqueue.HeartbeatArgs{Node: "a", Limits: l, Beat: 1})
		beat <- err
	}()
	select {
	case <-hold.held: // the heartbeat ran; its register is held
	case <-time.After(10 * time.Second):
		t.Fatal("the first heartbeat did not name the queue")
	}
	cancel()
	select {
	case err := <-beat:
		require.NoError(t, err)
	case <-time.After(10 * time.Second):
		t.Fatal("the heartbeat did not end at its context's end")
	}
}
