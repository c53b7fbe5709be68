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

// gatedAcquire is a fallback store whose first Acquire waits at the
// gate until the test opens it: the first waiter moving into the
// fallback queue is held on its way in, and those behind it wait for
// their turn meanwhile.
type gatedAcquire struct {
	fairqueue.Store
	once     sync.Once
	entered  chan struct{}
	open     chan struct{}
	acquires atomic.Int32
}

func newGatedAcquire() *gatedAcquire {
	return &gatedAcquire{Store: memstore.New(), entered: make(chan struct{}), open: make(chan struct{})}
}

func (g *gatedAcquire) Acquire(ctx context.Context, t fairqueue.TicketArgs) (fairqueue.AcquireResult, error) {
	g.acquires.Add(1)
	first := false
	g.once.Do(func() { first = true })
	if first {
		close(g.entered)
		<-g.open
	}
	return g.Store.Acquire(ctx, t)
}

// Local fallback, Redis back while the waiters of its queue still move
// into the fallback queue: one still waiting for its turn to enter it
// when the instance has gone back to Redis (the heartbeat counted
// everything, the fallback queue retired) waits in Redis' queue, not
// in a fallback queue opened anew for it, whose permit Redis would not
// count until the next heartbeat: Redis grants up to the permits beside
// it. permits 2, both held by instance b through the outage of a; a's
// two waiters move out, the first held on its way into the fallback
// queue until a is back on Redis.
func TestLocalFallbackMoverWhoseTurnComesOnceRedisIsBackWaitsInRedis(t *testing.T) {
	srv := redistest.Start(t)
	fb := newGatedAcquire()
	cfg := fairqueue.Config{Permits: 2, LocalPermits: 1, Fallback: fb,
		Lease: 30 * time.Second, PollInterval: 50 * time.Millisecond, MaxWait: 30 * time.Second}
	na, nb, px := cutOffPair(t, srv, "fbstutter", cfg, fairqueue.Request{}, fairqueue.Request{})
	var bHeld, aRunning atomic.Int32 // b's Redis permits held, a's requests served and running
	var held []*fairqueue.Permit
	for range 2 {
		p, err := nb.q.Acquire(context.Background(), fairqueue.Request{})
		require.NoError(t, err)
		require.False(t, p.Local())
		held = append(held, p)
		bHeld.Add(1)
	}
	type served struct {
		outcome
		atOnce int32 // b's Redis permits held and a's requests running as it was served, itself included
	}
	out := make(chan served, 2)
	for i := range 2 {
		queued := make(chan struct{}, 1)
		go func() {
			p, err := na.q.Acquire(context.Background(), fairqueue.Request{OnQueued: func(fairqueue.Waiting) {
				select {
				case queued <- struct{}{}:
				default:
				}
			}})
			if err != nil {
				out <- served{outcome: outcome{i: i, err: err}}
				return
			}
			// Counted until its release, which may hand its permit to
			// the other before b releases its second one.
			running := aRunning.Add(1)
			out <- served{outcome: outcome{i: i, local: p.Local()}, atOnce: bHeld.Load() + running}
			aRunning.Add(-1)
			p.Release()
		}()
		select {
		case <-queued:
		case <-time.After(10 * time.Second):
			t.Fatalf("request %d never queued", i)
		}
	}

	px.Cut()
	select {
	case <-fb.entered: // the first mover, on its way into the fallback queue
	case <-time.After(15 * time.Second):
		t.Fatal("the waiters never moved into the fallback queue")
	}
	st := na.q.Stats()
	require.False(t, st.StoreUp)
	require.Equal(t, 1, st.Waiting, "the first mover waits in the fallback queue, the second for its turn")
	px.Heal()
	// Back on Redis: the heartbeat counted the instance's permits (none),
	// and the fallback queue retired (its waiter left the count).
	eventually(t, 20*time.Second, func() bool {
		st := na.q.Stats()
		return st.StoreUp && st.Waiting == 0
	}, "a never went back to Redis: %+v", na.q.Stats())
	close(fb.open)

	// Both wait in Redis behind b's two permits, or one was served.
	answered := map[int]served{}
	eventually(t, 20*time.Second, func() bool {
		select {
		case s := <-out:
			answered[s.i] = s
		default:
		}
		return len(answered) > 0 || (na.q.Stats().Waiting == 2 && fb.acquires.Load() == 1)
	}, "the moved waiters neither served nor queued in Redis: %+v", na.q.Stats())
	for _, p := range held {
		bHeld.Add(-1)
		p.Release()
	}
	for len(answered) < 2 {
		select {
		case s := <-out:
			answered[s.i] = s
		case <-time.After(30 * time.Second):
			t.Fatalf("only %v answered", answered)
		}
	}
	for i, s := range answered {
		require.NoError(t, s.err, "request %d", i)
		assert.False(t, s.local, "request %d served by a fallback queue after a went back to Redis", i)
		assert.LessOrEqual(t, s.atOnce, int32(2), "request %d served beside b's Redis permits: %d at once on permits 2", i, s.atOnce)
	}
}
