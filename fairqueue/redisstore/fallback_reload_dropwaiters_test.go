package redisstore_test

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
	"github.com/fair-queue/caddy-fair-queue/internal/redistest"
)

// docs/failures.md, "When Redis fails": a reload during the outage that
// sets fail_closed or fail_open answers the requests that come after it
// by that policy; those already waiting in the fallback queue wait on
// there, each answered by its max_wait: served as a local permit ends, or refused timeout. None
// waits longer, and Redis, once back, counts the permit of the one
// served.
func TestFallbackWaitersAtAReloadThatDropsTheFallbackAreAnsweredWithinTheirMaxWait(t *testing.T) {
	t.Parallel() // its own redis-server: it waits on it, not on the CPU
	for _, policy := range []string{"fail_closed", "fail_open"} {
		t.Run(policy, func(t *testing.T) {
			t.Parallel()
			srv := redistest.Start(t)
			name := "fbdropwaiters" + policy
			n, _, p1 := gapNode(t, srv, name)

			// w waits behind p1 (local_permits 1); short waits too, with a
			// max_wait of 1 s.
			queued := make(chan struct{}, 3)
			onQueued := func(fairqueue.Waiting) { queued <- struct{}{} }
			w := make(chan acquired, 1)
			go func() {
				p, err := n.q.Acquire(context.Background(), fairqueue.Request{OnQueued: onQueued})
				w <- acquired{p: p, err: err, at: time.Now()}
			}()
			const shortWait = time.Second
			short := make(chan acquired, 2)
			var started sync.WaitGroup
			for range 2 {
				started.Add(1)
				go func() {
					started.Done()
					p, err := n.q.Acquire(context.Background(), fairqueue.Request{OnQueued: onQueued, MaxWait: shortWait})
					short <- acquired{p: p, err: err, at: time.Now()}
				}()
			}
			started.Wait()
			for range 3 {
				select {
				case <-queued:
				case <-time.After(10 * time.Second):
					t.Fatal("the waiters never queued in the fallback queue")
				}
			}

			reloaded := n.q.Config()
			reloaded.Fallback, reloaded.LocalPermits, reloaded.FailOpen = nil, 0, policy == "fail_open"
			require.NoError(t, n.q.Reconfigure(reloaded))

			// A request that comes now is answered by the new policy.
			p3, err := n.q.Acquire(context.Background(), fairqueue.Request{})
			if policy == "fail_open" {
				require.NoError(t, err)
				assert.True(t, p3.FailOpen(), "a request after the reload to fail_open admitted without Redis")
				p3.Release()
			} else {
				var re *fairqueue.RejectError
				require.ErrorAs(t, err, &re)
				assert.Equal(t, fairqueue.ReasonStoreUnavailable, re.Reason)
			}

			// The short waits end at their max_wait, refused timeout.
			for range 2 {
				select {
				case r := <-short:
					var re *fairqueue.RejectError
					require.True(t, errors.As(r.err, &re), "a waiter of 1 s max_wait with the one local permit held: %v", r.err)
					assert.Equal(t, fairqueue.ReasonTimeout, re.Reason)
					assert.Less(t, re.Waited, shortWait+2*time.Second, "answered long after its max_wait")
				case <-time.After(10 * time.Second):
					t.Fatal("a waiter of 1 s max_wait was never answered")
				}
			}

			// w is served by the fallback queue as p1 ends.
			select {
			case r := <-w:
				t.Fatalf("w was answered while the local permit was held: %v", r.err)
			default:
			}
			p1.Release()
			var r acquired
			select {
			case r = <-w:
			case <-time.After(10 * time.Second):
				t.Fatal("w was never served once the local permit was free")
			}
			require.NoError(t, r.err)
			defer r.p.Release()
			require.True(t, r.p.Local(), "w served by its fallback queue")

			// Redis back: its permit is counted there.
			srv.Restart()
			rdb := srv.Client(t)
			eventually(t, 20*time.Second, func() bool {
				return slices.Equal(readState(t, rdb, name).Holders, []string{r.p.Ticket()})
			}, "Redis never counted w's local permit")
		})
	}
}
