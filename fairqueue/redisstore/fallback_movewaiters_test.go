package redisstore_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
	"github.com/fair-queue/caddy-fair-queue/fairqueue/memstore"
	"github.com/fair-queue/caddy-fair-queue/internal/redistest"
)

// Local fallback, the outage: the requests waiting in the shared queue
// when Redis goes away move into the fallback queue, in the order they
// waited, ahead of the requests that come once the outage began: they
// are served there, not left waiting for Redis until their max_wait.
func TestLocalFallbackTakesInTheSharedQueuesWaitersInTheirOrder(t *testing.T) {
	t.Parallel() // its own redis-server: it waits on it, not on the CPU
	srv := redistest.Start(t)
	n := newNode(t, srv, "fbmoveout", moveOutConfig())
	held, outcomes := queuedAtTheOutage(t, n, srv.Kill)
	held.Release() // the Redis permit ends during the outage
	assertServedInTheirOrder(t, outcomes, n.q.Config().MaxWait)
}

// Local fallback, the outage cut off a node whose waiters Redis keeps:
// the waiters that moved into the fallback queue leave Redis's queue once
// it is back (a grant Redis makes them is given back), and the last leave
// leaves no key.
func TestLocalFallbackWaitersMovedOutLeaveNothingInRedis(t *testing.T) {
	srv := redistest.Start(t)
	calls := &endingCalls{}
	n, px := wrappedProxiedNode(t, srv, "fbmoveoutkeys", moveOutConfig(),
		func(s fairqueue.Store) fairqueue.Store { calls.Store = s; return calls })
	held, outcomes := queuedAtTheOutage(t, n, px.Cut)
	held.Release()
	assertServedInTheirOrder(t, outcomes, n.q.Config().MaxWait)

	px.Heal()
	eventually(t, 20*time.Second, func() bool {
		st := readState(t, n.rdb, "fbmoveoutkeys")
		return n.q.Stats().StoreUp && len(st.Waiting) == 0 && len(st.Holders) == 0
	}, "Redis kept the moved waiters, or a permit, for nobody: %+v", readState(t, n.rdb, "fbmoveoutkeys"))
	// The cancels of the moved waiters (and the release of the permit),
	// sent during the cut, may still be retried by the Redis client on
	// connections the cut left dead: one that ends in such a failure
	// marks the store unsure of a call Redis may still run, and the last
	// leave then keeps the tombstones for it (docs/failures.md). They end
	// before the request below is sent, whose answer settles them.
	eventually(t, 20*time.Second, func() bool { return calls.onTheirWay.Load() == 0 },
		"the cancels sent during the cut never ended")
	// Every permit is free: a request is granted by Redis at once.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	p, err := n.q.Acquire(ctx, fairqueue.Request{})
	require.NoError(t, err)
	p.Release()
	require.NoError(t, n.q.Close())
	assert.Empty(t, srv.Keys(t, "*"), "keys left after the last node left")
}

// endingCalls counts the cancels, releases and transfers of a node on
// their way to Redis (a Transferrer, as the Redis store it wraps).
type endingCalls struct {
	fairqueue.Store
	onTheirWay atomic.Int64
}

func (c *endingCalls) Transfer(ctx context.Context, t fairqueue.TicketArgs, to string) error {
	c.onTheirWay.Add(1)
	defer c.onTheirWay.Add(-1)
	return c.Store.(fairqueue.Transferrer).Transfer(ctx, t, to)
}

func (c *endingCalls) Cancel(ctx context.Context, t fairqueue.TicketArgs) error {
	c.onTheirWay.Add(1)
	defer c.onTheirWay.Add(-1)
	return c.Store.Cancel(ctx, t)
}

func (c *endingCalls) Release(ctx context.Context, t fairqueue.TicketArgs) error {
	c.onTheirWay.Add(1)
	defer c.onTheirWay.Add(-1)
	return c.Store.Release(ctx, t)
}

// queuedWaiters wait in Redis when the outage begins; newcomers come
// once the store is marked down.
const queuedWaiters, newcomers = 4, 2

func moveOutConfig() fairqueue.Config {
	return fairqueue.Config{Permits: 1, Fallback: memstore.New(),
		Lease: 30 * time.Second, PollInterval: 50 * time.Millisecond, MaxWait: 8 * time.Second}
}

// queuedAtTheOutage takes the one permit of n from Redis, queues
// queuedWaiters requests in Redis behind it (0 to 3), then cuts n from
// Redis with outage, waits until n marks the store down, and starts the
// newcomers (4 and 5), each once the one before has queued. It returns
// the permit held and where the requests report how they ended.
func queuedAtTheOutage(t *testing.T, n *node, outage func()) (*fairqueue.Permit, <-chan outcome) {
	t.Helper()
	held, err := n.q.Acquire(context.Background(), fairqueue.Request{})
	require.NoError(t, err)
	require.False(t, held.Local())
	out := make(chan outcome, queuedWaiters+newcomers)
	for i := range queuedWaiters {
		waitInTurn(t, n, i, out)
	}
	require.Len(t, readState(t, n.rdb, n.q.Config().Name).Waiting, queuedWaiters, "the waiters queued in Redis")
	outage()
	// The node reconciles while it has waiters: its failed calls mark
	// the store down.
	eventually(t, 10*time.Second, func() bool { return !n.q.Stats().StoreUp }, "Redis never marked down")
	for i := range newcomers {
		waitInTurn(t, n, queuedWaiters+i, out)
	}
	return held, out
}

// outcome is how request i ended: served (its permit, released at
// once, with how long it waited and whether it was local) or err.
type outcome struct {
	i      int
	err    error
	waited time.Duration
	local  bool
}

// waitInTurn starts request i on n, reporting to out, and returns once
// it has queued (OnQueued).
func waitInTurn(t *testing.T, n *node, i int, out chan<- outcome) {
	t.Helper()
	queued := make(chan struct{}, 1)
	go func() {
		p, err := n.q.Acquire(context.Background(), fairqueue.Request{OnQueued: func(fairqueue.Waiting) {
			select {
			case queued <- struct{}{}:
			default:
			}
		}})
		if err != nil {
			out <- outcome{i: i, err: err}
			return
		}
		out <- outcome{i: i, waited: p.Waited(), local: p.Local()}
		p.Release()
	}()
	select {
	case <-queued:
	case <-time.After(10 * time.Second):
		t.Fatalf("request %d never queued", i)
	}
}

// assertServedInTheirOrder reads every request's outcome: each was
// served by the fallback queue, in the order it came, none past maxWait.
func assertServedInTheirOrder(t *testing.T, outcomes <-chan outcome, maxWait time.Duration) {
	k := queuedWaiters + newcomers
	t.Helper()
	var order []string
	for range k {
		select {
		case o := <-outcomes:
			switch {
			case o.err != nil:
				order = append(order, fmt.Sprintf("%d:%v", o.i, o.err))
			case o.waited > maxWait:
				order = append(order, fmt.Sprintf("%d:waited %v", o.i, o.waited))
			case !o.local:
				order = append(order, fmt.Sprintf("%d:not local", o.i))
			default:
				order = append(order, fmt.Sprint(o.i))
			}
		case <-time.After(3 * maxWait):
			t.Fatalf("only %v answered", order)
		}
	}
	want := make([]string, k)
	for i := range want {
		want[i] = fmt.Sprint(i)
	}
	assert.Equal(t, want, order, "the waiters queued before the outage are served first, by the fallback queue, in their order")
}
