package redisstore_test

import (
	"context"
	"errors"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
	"github.com/fair-queue/caddy-fair-queue/fairqueue/memstore"
	"github.com/fair-queue/caddy-fair-queue/internal/redistest"
)

// awaitingTurn is the number of requests waiting for their turn to
// enter a fallback queue behind the waiters still moving there
// (fairqueue's awaitExit): nothing else tells of that wait.
func awaitingTurn() int {
	buf := make([]byte, 8<<20)
	buf = buf[:runtime.Stack(buf, true)]
	return strings.Count(string(buf), "fairqueue.(*Queue).awaitExit(")
}

// Local fallback, a reload while the waiters moving out of Redis' queue
// wait for their turn to enter the fallback queue: the fallback queue
// keeps the reload's permits. A mover whose turn came after the reload
// reset it to the settings it had read before its wait: local_permits 3
// lowered to 1, it ran 3 requests at once. Redis' one permit runs; its
// three waiters move out, the first held on its way into the fallback
// queue while the two behind it wait for their turn and the reload
// lands.
func TestLocalFallbackKeepsTheReloadedPermitsAcrossTheMoversTurns(t *testing.T) {
	srv := redistest.Start(t)
	fb := newGatedAcquire()
	t.Cleanup(func() {
		select {
		case <-fb.open:
		default:
			close(fb.open)
		}
	})
	cfg := fairqueue.Config{Permits: 1, LocalPermits: 3, Fallback: fb,
		Lease: 30 * time.Second, PollInterval: 50 * time.Millisecond, MaxWait: 30 * time.Second}
	n := newNode(t, srv, "fbreloadturn", cfg)
	held, err := n.q.Acquire(context.Background(), fairqueue.Request{})
	require.NoError(t, err)
	require.False(t, held.Local())

	// running is what runs on the upstream: held, then the movers served.
	var running, most atomic.Int32
	running.Store(1)
	run := func() {
		r := running.Add(1)
		for m := most.Load(); r > m && !most.CompareAndSwap(m, r); m = most.Load() {
		}
	}
	done := make(chan struct{})
	errs := make(chan error, 3)
	for i := range 3 {
		queued := make(chan struct{}, 1)
		go func() {
			p, err := n.q.Acquire(context.Background(), fairqueue.Request{OnQueued: func(fairqueue.Waiting) {
				select {
				case queued <- struct{}{}:
				default:
				}
			}})
			if err == nil && !p.Local() {
				err = errors.New("served by Redis, not the fallback queue")
			}
			errs <- err
			if p == nil {
				return
			}
			run()
			<-done
			running.Add(-1)
			p.Release()
		}()
		select {
		case <-queued:
		case <-time.After(10 * time.Second):
			t.Fatalf("request %d never queued in Redis", i)
		}
	}

	srv.Kill()
	select {
	case <-fb.entered: // the first mover, on its way into the fallback queue
	case <-time.After(15 * time.Second):
		t.Fatal("the waiters never moved into the fallback queue")
	}
	eventually(t, 10*time.Second, func() bool { return awaitingTurn() == 2 },
		"the two movers behind the first never waited for their turn: %d", awaitingTurn())

	cfg.LocalPermits = 1
	require.NoError(t, n.q.Reconfigure(cfg))
	close(fb.open)
	// All three enter the fallback queue; Redis' permit still runs.
	state := func() memstore.State { return fb.Store.(*memstore.Store).State() }
	eventually(t, 10*time.Second, func() bool { st := state(); return len(st.Waiting)+len(st.Holders) == 3 },
		"the movers never entered the fallback queue: %+v", state())

	// Redis' permit ends: the fallback queue's one permit is free.
	running.Add(-1)
	held.Release()
	eventually(t, 10*time.Second, func() bool { return len(state().Holders) > 0 },
		"the fallback queue served none of the movers")
	assert.Len(t, state().Holders, 1, "the fallback queue granted %d at once on local_permits 1", len(state().Holders))
	close(done)
	for i := range 3 {
		select {
		case err := <-errs:
			require.NoError(t, err, "a mover was not served by the fallback queue")
		case <-time.After(20 * time.Second):
			t.Fatalf("only %d movers answered", i)
		}
	}
	assert.LessOrEqual(t, most.Load(), int32(1), "requests ran at once on local_permits 1 (3 before the reload)")
}
