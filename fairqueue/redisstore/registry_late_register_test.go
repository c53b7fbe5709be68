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

// holdRegistry holds its client's next command on the registry key, once
// armed, until release is closed (the command then goes on whether or
// not its context ended meanwhile); ran is closed once that command ran,
// done once the client's next one on the registry key after it did too.
type holdRegistry struct {
	key     string
	armed   atomic.Bool
	after   atomic.Int32 // commands on the key run since the held one began
	held    chan struct{}
	release chan struct{}
	ran     chan struct{}
	done    chan struct{}
}

func newHoldRegistry() *holdRegistry {
	return &holdRegistry{key: redisstore.RegistryKey(""), held: make(chan struct{}, 1),
		release: make(chan struct{}), ran: make(chan struct{}), done: make(chan struct{})}
}

func (h *holdRegistry) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *holdRegistry) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

func (h *holdRegistry) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if !slices.Contains(cmd.Args(), any(h.key)) {
			return next(ctx, cmd)
		}
		if h.armed.CompareAndSwap(true, false) {
			h.held <- struct{}{}
			<-h.release
			ctx = context.WithoutCancel(ctx)
			h.after.Store(1)
		} else if h.after.Load() == 0 {
			return next(ctx, cmd)
		}
		err := next(ctx, cmd)
		switch h.after.Add(1) {
		case 2:
			close(h.ran)
		case 3:
			close(h.done)
		}
		return err
	}
}

// Instance A's first heartbeat names the queue; that call outlives the
// heartbeat's context (a client that does not end its calls at their
// deadline) and reaches Redis only after A's leave, the last, deleted
// the queue's keys. Meanwhile instance B opened the queue again, naming
// it. B's name must stay: its queue has keys, and should B's instances
// all crash, only the name has the queue swept. (Failed before the fix:
// A's late register wrote its own, earlier score over B's, and the
// unregister that follows it, for the name A's late call might have put
// back, took B's out.)
func TestALateRegisterAfterTheLastLeaveKeepsTheNameOfAQueueOpenedAgain(t *testing.T) {
	ctx := context.Background()
	srv := redistest.Start(t)
	ra := srv.Client(t) // ContextTimeoutEnabled off: calls bounded by the store
	hold := newHoldRegistry()
	ra.AddHook(hold)
	l := fairqueue.Limits{Permits: 1, Lease: 20 * time.Second}
	a := redisstore.New(ra, "q", redisstore.Options{})
	require.NoError(t, a.Open(ctx, "a", nopListener{}))
	t.Cleanup(func() { _ = a.Close() })

	heartbeatRegisterHeld(t, a, hold, l)
	require.NoError(t, a.Leave(ctx, "a", l))
	left := time.Now().UnixMilli()
	require.Empty(t, srv.Keys(t, "*"), "keys left after A's leave")

	// B opens the queue again, a millisecond later at least.
	eventually(t, 5*time.Second, func() bool { return time.Now().UnixMilli() > left }, "the clock stands still")
	rb := srv.Client(t)
	b := redisstore.New(rb, "q", redisstore.Options{})
	require.NoError(t, b.Open(ctx, "b", nopListener{}))
	t.Cleanup(func() { _ = b.Close() })
	r, err := b.Acquire(ctx, fairqueue.TicketArgs{ID: "b:1", Node: "b", Limits: l, Cost: 1})
	require.NoError(t, err)
	require.True(t, r.Granted)

	close(hold.release) // A's register reaches Redis now
	select {
	case <-hold.done:
	case <-time.After(10 * time.Second):
		t.Fatal("A's held register and the unregister after it did not run")
	}
	names, err := rb.ZRange(ctx, redisstore.RegistryKey(""), 0, -1).Result()
	require.NoError(t, err)
	assert.Equal(t, []string{"q"}, names, "the registry once A's late register ran (B's queue has keys: %v)", srv.Keys(t, "*"))
}
