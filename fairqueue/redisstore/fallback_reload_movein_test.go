package redisstore_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
	"github.com/fair-queue/caddy-fair-queue/fairqueue/memstore"
	"github.com/fair-queue/caddy-fair-queue/internal/redistest"
)

// gatedFallback is a fallback store whose cancels and acquires the test
// holds on their way (each gate once armed): a waiter leaving a retired
// fallback queue, and one entering the next fallback queue.
type gatedFallback struct {
	*memstore.Store
	cancel, acquire *gate
}

func (g *gatedFallback) Cancel(ctx context.Context, t fairqueue.TicketArgs) error {
	g.cancel.pass()
	return g.Store.Cancel(ctx, t)
}

func (g *gatedFallback) Acquire(ctx context.Context, t fairqueue.TicketArgs) (fairqueue.AcquireResult, error) {
	g.acquire.pass()
	return g.Store.Acquire(ctx, t)
}

// busyBeats answers the node's heartbeats busy while busy is set (a
// client out of connections): the store reads up, from the node's other
// calls, and the heartbeat that would adopt the local permits, and retire
// the fallback queue, has not run yet.
type busyBeats struct {
	fairqueue.Store
	busy atomic.Bool
}

func (b *busyBeats) Heartbeat(ctx context.Context, hb fairqueue.HeartbeatArgs) (fairqueue.HeartbeatResult, error) {
	if b.busy.Load() {
		return fairqueue.HeartbeatResult{}, fmt.Errorf("held by the test: %w", fairqueue.ErrStoreBusy)
	}
	return b.Store.Heartbeat(ctx, hb)
}

func (b *busyBeats) Transfer(ctx context.Context, t fairqueue.TicketArgs, to string) error {
	return b.Store.(fairqueue.Transferrer).Transfer(ctx, t, to)
}

// A request of a retired fallback queue moving back to Redis finds Redis
// gone again, and waits for its turn into the next fallback queue behind
// Redis's waiters moving there. Meanwhile a reload sets fail_closed and
// Redis comes back: let in, the request goes to Redis's queue (through
// the new fallback queue, until the heartbeat that has Redis count its
// permits retires it, as under local). It is
// still the first of the requests moving back from the retired fallback
// queue (its number there not passed until it queues): it goes ahead of
// them, not behind its own number, where it waited for itself until its
// max wait, and every request behind it with it.
func TestARequestMovingBackFromTheFallbackAndGoneToRedisAfterAReloadDoesNotWaitForItself(t *testing.T) {
	srv := redistest.Start(t)
	fb := &gatedFallback{Store: memstore.New(), cancel: newGate(), acquire: newGate()}
	beats := &busyBeats{}
	t.Cleanup(func() {
		for _, g := range []*gate{fb.cancel, fb.acquire} {
			select {
			case <-g.go_:
			default:
				close(g.go_)
			}
		}
	})
	const maxWait = 30 * time.Second
	cfg := fairqueue.Config{Permits: 1, LocalPermits: 1, Fallback: fb, MaxWait: maxWait,
		Lease: 30 * time.Second, PollInterval: 50 * time.Millisecond,
		Upstreams: []fairqueue.Upstream{{Dial: "u1:1", Permits: 1}}}
	n, px := wrappedProxiedNode(t, srv, "fbmovebackreload", cfg,
		func(s fairqueue.Store) fairqueue.Store { beats.Store = s; return beats })
	holder, err := n.q.Acquire(context.Background(), fairqueue.Request{})
	require.NoError(t, err)
	require.False(t, holder.Local())

	// Outage 1: r waits in the fallback queue, behind the holder's
	// Redis permit, which still runs.
	px.Cut()
	eventually(t, 10*time.Second, func() bool { return !n.q.Stats().StoreUp }, "Redis never marked down")
	type result struct {
		p   *fairqueue.Permit
		err error
	}
	r := make(chan result, 1)
	queued := make(chan struct{}, 1)
	go func() {
		p, err := n.q.Acquire(context.Background(), fairqueue.Request{OnQueued: func(fairqueue.Waiting) {
			select {
			case queued <- struct{}{}:
			default:
			}
		}})
		r <- result{p, err}
	}()
	select {
	case <-queued:
	case <-time.After(10 * time.Second):
		t.Fatal("r never queued in the fallback queue")
	}

	// Redis is back: the fallback queue retires, and r, leaving it, is
	// held as its ticket there is cancelled, before it moves back.
	fb.cancel.hold.Store(true)
	px.Heal()
	closedIn(t, fb.cancel.entered, "r never left the retired fallback queue")

	// The holder waits again in Redis, its upstream cooling: Redis's
	// one waiter when the link is cut again (outage 2), it moves into
	// a new fallback queue, held on its way.
	requeued := make(chan result, 1)
	go func() {
		p, err := holder.Requeue(context.Background(), 5*time.Second)
		requeued <- result{p, err}
	}()
	eventually(t, 10*time.Second, func() bool {
		return len(readState(t, n.rdb, "fbmovebackreload").Waiting) == 1
	}, "the holder never waited again in Redis")
	fb.acquire.hold.Store(true)
	px.Cut()
	eventually(t, 10*time.Second, func() bool { return !n.q.Stats().StoreUp }, "Redis never marked down again")
	closedIn(t, fb.acquire.entered, "the holder never moved into the new fallback queue")

	// r moves back: Redis is down, and it waits for its turn into the
	// new fallback queue, behind the holder.
	close(fb.cancel.go_)
	waitForGoroutineIn(t, "fairqueue.(*Queue).awaitExit")

	// A reload sets fail_closed, and Redis comes back (read up before
	// the heartbeat that would retire the new fallback queue runs).
	closed := n.q.Config()
	closed.Fallback = nil
	require.NoError(t, n.q.Reconfigure(closed))
	beats.busy.Store(true)
	px.Heal()
	eventually(t, 20*time.Second, func() bool { return n.q.Stats().StoreUp }, "Redis never marked up again")
	close(fb.acquire.go_) // the holder enters the fallback queue: r's turn
	beats.busy.Store(false)

	// The holder, served by the new fallback queue, ends: r is served
	// long before its max wait.
	var h result
	select {
	case h = <-requeued:
	case <-time.After(2 * maxWait):
		t.Fatal("the holder was never answered")
	}
	require.NoError(t, h.err)
	h.p.Release()
	var got result
	select {
	case got = <-r:
	case <-time.After(2 * maxWait):
		t.Fatal("r was never answered")
	}
	var re *fairqueue.RejectError
	if errors.As(got.err, &re) {
		t.Fatalf("r was refused %s after %v while Redis was up and its permit free: moving back, it waited behind its own turn", re.Reason, re.Waited)
	}
	require.NoError(t, got.err)
	defer got.p.Release()
	// Let in as Redis reads up, before the heartbeat that has Redis count
	// the new fallback queue's permits retires it, r waits there, as under
	// local (granted by Redis, it would run beside the holder's local
	// permit, uncounted there): it is served there, or by Redis once that
	// heartbeat has run. Either way Redis counts its permit.
	require.False(t, got.p.FailOpen(), "r admitted without Redis")
	eventually(t, 20*time.Second, func() bool {
		return slices.Equal(readState(t, n.rdb, "fbmovebackreload").Holders, []string{got.p.Ticket()})
	}, "Redis never counted r's permit alone")
}
