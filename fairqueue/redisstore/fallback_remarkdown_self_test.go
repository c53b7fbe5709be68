package redisstore_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
	"github.com/fair-queue/caddy-fair-queue/internal/redistest"
)

// gatedStoreAcquire is a Store whose first Acquire once armed waits at
// the gate (entered is closed then) until the test opens it: a request's
// call to Redis held on its way.
type gatedStoreAcquire struct {
	fairqueue.Store
	arm     atomic.Bool
	once    sync.Once
	entered chan struct{}
	open    chan struct{}
}

func (g *gatedStoreAcquire) Acquire(ctx context.Context, t fairqueue.TicketArgs) (fairqueue.AcquireResult, error) {
	if g.arm.Load() {
		first := false
		g.once.Do(func() { first = true })
		if first {
			close(g.entered)
			<-g.open
		}
	}
	return g.Store.Acquire(ctx, t)
}

// docs/failures.md, "When Redis fails": a waiter of Redis's queue moving
// into the fallback queue whose turn came once Redis was back (the
// fallback queue retired) goes to Redis's queue; where its call fails
// (Redis gone again) it waits in the fallback queue, still ahead of the
// movers behind it. It must not wait behind itself: the store marked
// down again while it held its place in the line of the move (it had not
// queued anywhere yet), the line went on, and the request joined it
// behind its own number: it waited until its max wait, and every mover
// behind it, and was refused (timeout) with the fallback queue's permit
// free. Permits 1, held by the instance's own Redis request; two waiters
// queued in Redis move out as it is cut off, the first held on its way
// into the fallback queue; Redis answers again (the fallback queue
// retires), the first mover's call to Redis is held, Redis goes away
// again and that call fails.
func TestAMoverWhoseCallToRedisFailsAfterASecondMarkDownIsNotQueuedBehindItself(t *testing.T) {
	srv := redistest.Start(t)
	fb := newGatedAcquire()
	gate := &gatedStoreAcquire{entered: make(chan struct{}), open: make(chan struct{})}
	cfg := fairqueue.Config{Permits: 1, LocalPermits: 1, Fallback: fb, DownAfter: 1,
		Lease: 30 * time.Second, PollInterval: 50 * time.Millisecond, MaxWait: 20 * time.Second}
	n, px := wrappedProxiedNode(t, srv, "fbremarkself", cfg, func(s fairqueue.Store) fairqueue.Store { gate.Store = s; return gate })
	fbOpen, gateOpen := false, false
	t.Cleanup(func() { // before the node closes: a mover may be held at a gate
		if !fbOpen {
			close(fb.open)
		}
		if !gateOpen {
			close(gate.open)
		}
	})

	held, err := n.q.Acquire(context.Background(), fairqueue.Request{})
	if err != nil {
		t.Fatal(err)
	}
	released := false
	defer func() {
		if !released {
			held.Release()
		}
	}()
	out := make(chan outcome, 2)
	for i := range 2 {
		waitInTurn(t, n, i, out)
	}

	px.Cut()
	select {
	case <-fb.entered: // the first mover, on its way into the fallback queue
	case <-time.After(15 * time.Second):
		t.Fatal("the waiters never moved into the fallback queue")
	}
	px.Heal()
	// Back on Redis: the heartbeat counted the instance's permits, and
	// the fallback queue retired (its waiter left the count).
	eventually(t, 20*time.Second, func() bool {
		st := n.q.Stats()
		return st.StoreUp && st.Waiting == 0
	}, "the instance never went back to Redis: %+v", n.q.Stats())
	gate.arm.Store(true)
	fbOpen = true
	close(fb.open)
	select {
	case <-gate.entered: // the first mover, on its way into Redis's queue
	case <-time.After(15 * time.Second):
		t.Fatal("the first mover never went to Redis")
	}
	px.Cut()
	gateOpen = true
	close(gate.open) // its call fails: Redis is marked down again
	released = true
	held.Release()

	var order []string
	for range 2 {
		select {
		case o := <-out:
			if o.err != nil {
				order = append(order, fmt.Sprintf("%d:%v", o.i, o.err))
			} else {
				order = append(order, fmt.Sprint(o.i))
			}
		case <-time.After(60 * time.Second):
			t.Fatalf("only %v answered", order)
		}
	}
	assert.Equal(t, []string{"0", "1"}, order, "the movers are served in their order, by the fallback queue")
}
