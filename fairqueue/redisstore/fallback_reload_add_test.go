package redisstore_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
	"github.com/fair-queue/caddy-fair-queue/fairqueue/memstore"
	"github.com/fair-queue/caddy-fair-queue/internal/redistest"
)

// docs/failures.md, "When Redis fails": with local, the requests waiting
// in Redis's queue when the store is marked down move into the fallback
// queue, ahead of the requests that come after, rather than waiting for
// Redis until their max_wait. A reload that sets local during the outage
// (from fail_closed or fail_open, which leave them waiting for Redis)
// moves them likewise: left waiting for Redis, the waiter w, queued
// behind the holder in Redis before the outage, waited on for Redis
// while the fallback queue served r, which came after the reload, as
// the holder ended; w was refused timeout at its max_wait.
func TestAReloadThatSetsLocalDuringAnOutageMovesRedissWaitersIntoTheFallback(t *testing.T) {
	t.Parallel() // its own redis-server: it waits on it, not on the CPU
	for _, policy := range []string{"fail_closed", "fail_open"} {
		t.Run(policy, func(t *testing.T) {
			t.Parallel()
			srv := redistest.Start(t)
			name := "fbreloadadd" + policy
			cfg := fairqueue.Config{Permits: 1, FailOpen: policy == "fail_open",
				Lease: 30 * time.Second, PollInterval: 50 * time.Millisecond, MaxWait: 30 * time.Second}
			n := newNode(t, srv, name, cfg)
			holder, err := n.q.Acquire(context.Background(), fairqueue.Request{})
			require.NoError(t, err)
			var once sync.Once
			defer once.Do(holder.Release)

			queued := make(chan struct{}, 2)
			onQueued := func(fairqueue.Waiting) { queued <- struct{}{} }
			w := make(chan acquired, 1)
			go func() {
				p, err := n.q.Acquire(context.Background(), fairqueue.Request{OnQueued: onQueued})
				w <- acquired{p: p, err: err}
			}()
			select {
			case <-queued:
			case <-time.After(10 * time.Second):
				t.Fatal("w never queued in Redis")
			}

			srv.Kill()
			eventually(t, 10*time.Second, func() bool { return !n.q.Stats().StoreUp }, "Redis never marked down")
			local := n.q.Config()
			local.Fallback, local.LocalPermits, local.FailOpen = memstore.New(), 1, false
			require.NoError(t, n.q.Reconfigure(local))

			r := make(chan acquired, 1)
			go func() {
				p, err := n.q.Acquire(context.Background(), fairqueue.Request{OnQueued: onQueued})
				r <- acquired{p: p, err: err}
			}()
			select {
			case <-queued:
			case got := <-r:
				if got.p != nil {
					got.p.Release()
				}
				t.Fatalf("r was answered while the holder ran (local_permits 1): %v", got.err)
			case <-time.After(10 * time.Second):
				t.Fatal("r never queued in the fallback queue")
			}

			// The holder ends: the fallback queue serves w, which waited
			// first.
			once.Do(holder.Release)
			select {
			case got := <-w:
				require.NoError(t, got.err)
				require.True(t, got.p.Local(), "w served by the fallback queue")
				got.p.Release()
			case got := <-r:
				if got.p != nil {
					got.p.Release()
				}
				t.Fatalf("r, which came after the reload, was served first (%v); w, queued in Redis before the outage, waited on for Redis", got.err)
			case <-time.After(10 * time.Second):
				t.Fatal("nobody was served once the holder ended")
			}
			select {
			case got := <-r:
				require.NoError(t, got.err)
				got.p.Release()
			case <-time.After(10 * time.Second):
				t.Fatal("r was never served once w ended")
			}
		})
	}
}

// The local fallback counts the instance's own requests still running
// when its fallback queue opens. A reload that sets local during an
// outage under fail_open finds requests that fail_open let in running:
// they run on the upstream as the requests Redis granted do, and the
// fallback queue, counting none of them, served r at once beside the
// one running: 2 at once under local_permits 1 (and permits 1).
func TestAReloadThatSetsLocalDuringAnOutageCountsTheFailOpenRequestsRunning(t *testing.T) {
	t.Parallel() // its own redis-server: it waits on it, not on the CPU
	srv := redistest.Start(t)
	const name = "fbreloadaddopen"
	cfg := fairqueue.Config{Permits: 1, FailOpen: true,
		Lease: 30 * time.Second, PollInterval: 50 * time.Millisecond, MaxWait: 30 * time.Second}
	n := newNode(t, srv, name, cfg)
	p, err := n.q.Acquire(context.Background(), fairqueue.Request{})
	require.NoError(t, err)
	p.Release() // joined

	srv.Kill()
	open, err := n.q.Acquire(context.Background(), fairqueue.Request{})
	require.NoError(t, err)
	require.True(t, open.FailOpen(), "admitted by fail_open while Redis is down")
	var once sync.Once
	defer once.Do(open.Release)

	local := n.q.Config()
	local.Fallback, local.LocalPermits, local.FailOpen = memstore.New(), 1, false
	require.NoError(t, n.q.Reconfigure(local))
	servedOnceTheFailOpenRequestEnds(t, n, func() { once.Do(open.Release) })
}

// As above, where the fallback queue of the outage is open already: a
// reload sets fail_open during the outage (the fallback queue lives on,
// with its waiters and permits), fail_open lets a request in, and a
// reload sets local again. The fallback queue counted the requests
// running as it opened, not the one fail_open let in since: it served r
// at once beside it, 2 at once under local_permits 1 (and permits 1).
func TestAReloadThatSetsLocalAgainDuringAnOutageCountsTheFailOpenRequestsRunning(t *testing.T) {
	t.Parallel() // its own redis-server: it waits on it, not on the CPU
	srv := redistest.Start(t)
	const name = "fbreloadagainopen"
	cfg := fairqueue.Config{Permits: 1, LocalPermits: 1, Fallback: memstore.New(),
		Lease: 30 * time.Second, PollInterval: 50 * time.Millisecond, MaxWait: 30 * time.Second}
	n := newNode(t, srv, name, cfg)
	p, err := n.q.Acquire(context.Background(), fairqueue.Request{})
	require.NoError(t, err)
	p.Release() // joined

	srv.Kill()
	first, err := n.q.Acquire(context.Background(), fairqueue.Request{})
	require.NoError(t, err)
	require.True(t, first.Local(), "served by the fallback queue while Redis is down")
	first.Release() // the fallback queue stays open: Redis is down

	failOpen := n.q.Config()
	failOpen.Fallback, failOpen.LocalPermits, failOpen.FailOpen = nil, 0, true
	require.NoError(t, n.q.Reconfigure(failOpen))
	open, err := n.q.Acquire(context.Background(), fairqueue.Request{})
	require.NoError(t, err)
	require.True(t, open.FailOpen(), "admitted by fail_open while Redis is down")
	var once sync.Once
	defer once.Do(open.Release)

	require.NoError(t, n.q.Reconfigure(cfg))
	servedOnceTheFailOpenRequestEnds(t, n, func() { once.Do(open.Release) })
}

// servedOnceTheFailOpenRequestEnds checks that a request r to n, whose
// fallback queue has local_permits 1 while a request fail_open let in
// runs, is served by the fallback queue only once end has ended that
// request.
func servedOnceTheFailOpenRequestEnds(t *testing.T, n *node, end func()) {
	t.Helper()
	r := make(chan acquired, 1)
	go func() {
		p, err := n.q.Acquire(context.Background(), fairqueue.Request{})
		r <- acquired{p: p, err: err}
	}()
	select {
	case got := <-r:
		if got.p != nil {
			got.p.Release()
		}
		t.Fatalf("r was served (%v) beside the fail_open request still running: 2 at once under local_permits 1", got.err)
	case <-time.After(time.Second):
	}
	end()
	select {
	case got := <-r:
		require.NoError(t, got.err)
		require.True(t, got.p.Local(), "r served by the fallback queue")
		got.p.Release()
	case <-time.After(10 * time.Second):
		t.Fatal("r was never served once the fail_open request ended")
	}
}
