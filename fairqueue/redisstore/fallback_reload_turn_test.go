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
func TestARequestWaitingItsTurnIntoTheFallbackKeepsAReloadsLocalPermits(t *testing.T) {
	srv := redistest.Start(t)
	fb := &heldFallback{Store: memstore.New(), entered: make(chan struct{}), lets: make(chan struct{})}
	cfg := fairqueue.Config{Permits: 1, LocalPermits: 3, Fallback: fb,
		Lease: 30 * time.Second, PollInterval: 50 * time.Millisecond, MaxWait: 30 * time.Second}
	n := newNode(t, srv, "fbturnreload", cfg)
	holder, err := n.q.Acquire(context.Background(), fairqueue.Request{})
	require.NoError(t, err)
	defer holder.Release()

	// w1 waits in Redis behind the holder.
	queued := make(chan struct{})
	w1 := make(chan *fairqueue.Permit, 1)
	go func() {
		p, err := n.q.Acquire(context.Background(), fairqueue.Request{OnQueued: func(fairqueue.Waiting) {
			select {
			case <-queued:
			default:
				close(queued)
			}
		}})
		assert.NoError(t, err)
		w1 <- p
	}()
	<-queued

	// Redis goes away: w1 moves into the fallback queue, held on its way.
	srv.Kill()
	eventually(t, 10*time.Second, func() bool { return !n.q.Stats().StoreUp }, "Redis never marked down")
	<-fb.entered

	// r2 comes now, and waits for its turn behind w1.
	r2 := make(chan *fairqueue.Permit, 1)
	go func() {
		p, err := n.q.Acquire(context.Background(), fairqueue.Request{})
		assert.NoError(t, err)
		r2 <- p
	}()
	waitForGoroutineIn(t, "fairqueue.(*Queue).awaitExit")

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
	case p := <-r2:
		if p != nil {
			p.Release()
		}
		t.Fatal("r2 started beside the holder and w1 under 2 local permits: it gave the fallback queue the 3 of before the reload")
	case <-time.After(300 * time.Millisecond):
	}
	p1.Release()
	p2 := <-r2
	require.NotNil(t, p2)
	require.True(t, p2.Local())
	p2.Release()
}
