package redisstore_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
	"github.com/fair-queue/caddy-fair-queue/internal/redistest"
)

// docs/failures.md, "When Redis fails": the requests that come while
// Redis's waiters move into the fallback queue enter it behind them.
// Also where the store is marked down a second time as they move (Redis
// answered for a moment, the heartbeat that would count the fallback
// queue's permits failed): that second mark finds no waiter left in
// Redis's queue, and must not start a new line for the requests that
// come, empty, which let them into the fallback queue ahead of the
// waiters still moving. Permits 1, held by the instance's own Redis
// request; two waiters queued in Redis move out as it is cut off, the
// first held on its way into the fallback queue (its fallback store's
// first acquire), the second waiting for its turn; Redis answers
// again, its heartbeat is held, Redis goes away again and that
// heartbeat fails (down_after 1). The request that comes then is served
// third.
func TestARequestAfterASecondMarkDownEntersTheFallbackBehindTheWaitersStillMoving(t *testing.T) {
	t.Parallel() // its own redis-server: it waits on it, not on the CPU
	srv := redistest.Start(t)
	fb := newGatedAcquire()
	hb := &gapBeatStore{held: make(chan struct{}), release: make(chan struct{})}
	// A long lease: no regular heartbeat comes during the test.
	cfg := fairqueue.Config{Permits: 1, LocalPermits: 1, Fallback: fb, DownAfter: 1,
		Lease: 3 * time.Minute, PollInterval: 50 * time.Millisecond, MaxWait: 30 * time.Second}
	n, px := wrappedProxiedNode(t, srv, "fbremarkdown", cfg, func(s fairqueue.Store) fairqueue.Store { hb.Store = s; return hb })
	hb.up = func() bool { return n.q.Stats().StoreUp }
	opened := false
	t.Cleanup(func() { // before the node closes: its loop may be held in a heartbeat, a mover at the gate
		if !opened {
			close(fb.open)
		}
		select {
		case <-hb.release:
		default:
			close(hb.release)
		}
	})

	held, err := n.q.Acquire(context.Background(), fairqueue.Request{})
	require.NoError(t, err)
	require.False(t, held.Local())
	out := make(chan outcome, 3)
	for i := range 2 {
		waitInTurn(t, n, i, out)
	}

	px.Cut()
	select {
	case <-fb.entered: // the first mover, on its way into the fallback queue
	case <-time.After(15 * time.Second):
		t.Fatal("the waiters never moved into the fallback queue")
	}
	hb.arm.Store(true)
	px.Heal()
	select {
	case <-hb.held: // Redis answers; the heartbeat that would count the fallback queue's permits waits
	case <-time.After(20 * time.Second):
		t.Fatal("no heartbeat once Redis answered again")
	}
	px.Cut()
	close(hb.release) // it fails: the store is marked down again
	eventually(t, 20*time.Second, func() bool { return !n.q.Stats().StoreUp }, "Redis never marked down again")

	queued := make(chan struct{}, 1)
	go func() {
		p, err := n.q.Acquire(context.Background(), fairqueue.Request{OnQueued: func(fairqueue.Waiting) {
			select {
			case queued <- struct{}{}:
			default:
			}
		}})
		if err != nil {
			out <- outcome{i: 2, err: err}
			return
		}
		out <- outcome{i: 2, waited: p.Waited(), local: p.Local()}
		p.Release()
	}()
	select {
	case <-queued:
		t.Error("the request after the second mark down queued in the fallback queue while the first mover was still on its way in")
	case <-time.After(time.Second):
	}
	opened = true
	close(fb.open)
	held.Release()

	var order []string
	for range 3 {
		select {
		case o := <-out:
			switch {
			case o.err != nil:
				order = append(order, fmt.Sprintf("%d:%v", o.i, o.err))
			case !o.local:
				order = append(order, fmt.Sprintf("%d:not local", o.i))
			default:
				order = append(order, fmt.Sprint(o.i))
			}
		case <-time.After(60 * time.Second):
			t.Fatalf("only %v answered", order)
		}
	}
	assert.Equal(t, []string{"0", "1", "2"}, order, "the moved waiters are served first, in their order, by the fallback queue")
}
