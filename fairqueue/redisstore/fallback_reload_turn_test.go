package redisstore_test

import (
	"context"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
	"github.com/fair-queue/caddy-fair-queue/fairqueue/memstore"
	"github.com/fair-queue/caddy-fair-queue/internal/redistest"
)

// heldFallback is a fallback store whose first Acquire waits until the
// test lets it go: the first waiter moving into the fallback queue is
// not queued there yet, and those behind it in the move wait their turn.
type heldFallback struct {
	*memstore.Store
	once          sync.Once
	entered, lets chan struct{}
}

func (h *heldFallback) Acquire(ctx context.Context, t fairqueue.TicketArgs) (fairqueue.AcquireResult, error) {
	h.once.Do(func() {
		close(h.entered)
		<-h.lets
	})
	return h.Store.Acquire(ctx, t)
}

// waitForGoroutineIn waits until a goroutine runs (or is parked in)
// function fn, as named in a goroutine dump.
func waitForGoroutineIn(t *testing.T, fn string) {
	t.Helper()
	buf := make([]byte, 1<<20)
	eventually(t, 10*time.Second, func() bool {
		return strings.Contains(string(buf[:runtime.Stack(buf, true)]), fn)
	}, "no goroutine in %s", fn)
}

// A request that comes while Redis's waiters move into the fallback
// queue waits for its turn behind them with the settings it read as it
// came. A reload meanwhile gives the fallback queue its settings; the
// request, let in after, joins the fallback queue under the settings in
// force, and does not give it back those before the reload, which would
// start it beside the permits the reload allows.
// movingTurn is a node (permits 1, local_permits 3) whose holder runs
// in Redis, whose waiter w1, queued behind it, was held on its way into
// the fallback queue (fb) as Redis went away (srv killed), and a request
// r2 that came then and waits for its turn behind w1 (awaitExit).
type movingTurn struct {
	srv    *redistest.Server
	n      *node
	fb     *heldFallback
	holder *fairqueue.Permit
	w1     chan *fairqueue.Permit
	r2     chan acquired
}

func startMovingTurn(t *testing.T, name string) *movingTurn {
	m := &movingTurn{srv: redistest.Start(t), w1: make(chan *fairqueue.Permit, 1), r2: make(chan acquired, 1)}
	m.fb = &heldFallback{Store: memstore.New(), entered: make(chan struct{}), lets: make(chan struct{})}
	t.Cleanup(func() {
		select {
		case <-m.fb.lets:
		default:
			close(m.fb.lets)
		}
	})
	cfg := fairqueue.Config{Permits: 1, LocalPermits: 3, Fallback: m.fb,
		Lease: 30 * time.Second, PollInterval: 50 * time.Millisecond, MaxWait: 30 * time.Second}
	m.n = newNode(t, m.srv, name, cfg)
	var err error
	m.holder, err = m.n.q.Acquire(context.Background(), fairqueue.Request{})
	require.NoError(t, err)

	// w1 waits in Redis behind the holder.
	queued := make(chan struct{})
	go func() {
		p, err := m.n.q.Acquire(context.Background(), fairqueue.Request{OnQueued: func(fairqueue.Waiting) {
			select {
			case <-queued:
			default:
				close(queued)
			}
		}})
		assert.NoError(t, err)
		m.w1 <- p
	}()
	<-queued

	// Redis goes away: w1 moves into the fallback queue, held on its way.
	m.srv.Kill()
	eventually(t, 10*time.Second, func() bool { return !m.n.q.Stats().StoreUp }, "Redis never marked down")
	select {
	case <-m.fb.entered:
	case <-time.After(30 * time.Second):
		// Seen once in CI on a loaded machine (the package then timed
		// out): fail with the goroutines, not hang.
		buf := make([]byte, 1<<20)
		t.Fatalf("w1 never entered the fallback queue; goroutines:\n%s", buf[:runtime.Stack(buf, true)])
	}

	// r2 comes now, and waits for its turn behind w1.
	go func() {
		p, err := m.n.q.Acquire(context.Background(), fairqueue.Request{})
		m.r2 <- acquired{p: p, err: err}
	}()
	waitForGoroutineIn(t, "fairqueue.(*Queue).awaitExit")
	return m
}

func TestARequestWaitingItsTurnIntoTheFallbackKeepsAReloadsLocalPermits(t *testing.T) {
	t.Parallel() // its own redis-server: it waits on it, not on the CPU
	m := startMovingTurn(t, "fbturnreload")
	n, fb, w1, r2 := m.n, m.fb, m.w1, m.r2
	defer m.holder.Release()

	// A reload lowers the fallback queue's permits to 2: the holder and
	// w1.
	lowered := n.q.Config()
	lowered.LocalPermits = 2
	require.NoError(t, n.q.Reconfigure(lowered))
	close(fb.lets)

	p1 := <-w1
	require.NotNil(t, p1)
	require.True(t, p1.Local(), "w1 served by Redis")
	select {
	case r := <-r2:
		if r.p != nil {
			r.p.Release()
		}
		t.Fatal("r2 started beside the holder and w1 under 2 local permits: it gave the fallback queue the 3 of before the reload")
	case <-time.After(300 * time.Millisecond):
	}
	p1.Release()
	r := <-r2
	require.NoError(t, r.err)
	require.True(t, r.p.Local())
	r.p.Release()
}
