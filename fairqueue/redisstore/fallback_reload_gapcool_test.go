package redisstore_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
	"github.com/fair-queue/caddy-fair-queue/fairqueue/memstore"
	"github.com/fair-queue/caddy-fair-queue/internal/redistest"
)

// A pool of two upstreams, a request Redis granted on each, running at
// the outage under local; a reload during the outage sets fail_closed
// (or fail_open), Redis comes back, and before the heartbeat that has it
// count the fallback queue's permits (held), the upstream of one refuses
// it (Requeue with a cooldown): the request waits in the fallback queue
// (docs/failures.md: until that heartbeat, as under local), and that
// queue must leave the upstream out of dispatch for the cooldown, as it
// does under local. The cooldown went to Redis alone (the settings had
// no fallback queue): the fallback queue granted the request again at
// once on the upstream that had just refused it.
func TestARequeueInTheGapAfterAReloadThatDroppedTheFallbackCoolsItsUpstreamThere(t *testing.T) {
	t.Parallel() // its own redis-server: it waits on it, not on the CPU
	for _, policy := range []string{"local", "fail_closed", "fail_open"} {
		t.Run(policy, func(t *testing.T) {
			t.Parallel()
			srv := redistest.Start(t)
			hb := &gapBeatStore{held: make(chan struct{}), release: make(chan struct{})}
			cfg := fairqueue.Config{Upstreams: []fairqueue.Upstream{{Dial: "10.0.0.1:8000", Permits: 1}, {Dial: "10.0.0.2:8000", Permits: 1}},
				Fallback: memstore.New(), Lease: 3 * time.Minute, PollInterval: 50 * time.Millisecond, MaxWait: 20 * time.Second}
			n := wrappedNode(t, srv, "fbgapcool"+policy, cfg, func(s fairqueue.Store) fairqueue.Store { hb.Store = s; return hb })
			hb.up = func() bool { return n.q.Stats().StoreUp }
			t.Cleanup(func() { // before the node closes: its loop may be held in a heartbeat
				select {
				case <-hb.release:
				default:
					close(hb.release)
				}
			})
			queued := make(chan struct{}, 1)
			first, err := n.q.Acquire(context.Background(), fairqueue.Request{OnQueued: func(fairqueue.Waiting) {
				select {
				case queued <- struct{}{}:
				default:
				}
			}})
			require.NoError(t, err)
			other, err := n.q.Acquire(context.Background(), fairqueue.Request{})
			require.NoError(t, err)
			defer other.Release()
			refused := first.Upstream()
			require.NotEqual(t, refused, other.Upstream(), "Redis granted one request on each upstream")

			srv.Kill()
			// A request during the outage opens the fallback queue (it
			// counts both running) and waits there until it gives up. Until
			// one has queued there: the instance's loop may mark Redis down
			// first, and no fallback queue is open at the reload then: no
			// gap, the requeue went to Redis (back with its data lost) and
			// was served there, on the upstream that had refused it.
			inFallback := make(chan struct{}, 1)
			waiter := fairqueue.Request{OnQueued: func(fairqueue.Waiting) { // Redis is gone: queued in the fallback queue
				select {
				case inFallback <- struct{}{}:
				default:
				}
			}}
			eventually(t, 10*time.Second, func() bool {
				if p := tryAcquire(t, n, waiter, 100*time.Millisecond); p != nil {
					p.Release()
					t.Fatalf("a request was served beside the two running (%v)", p.Upstream())
				}
				select {
				case <-inFallback:
					return !n.q.Stats().StoreUp
				default:
					return false
				}
			}, "no request waited in the fallback queue")

			reloaded := n.q.Config()
			if policy != "local" {
				reloaded.Fallback, reloaded.FailOpen = nil, policy == "fail_open"
			}
			require.NoError(t, n.q.Reconfigure(reloaded))
			hb.intoTheGap(t, n, srv)

			requeued := make(chan acquired, 1)
			go func() {
				ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
				defer cancel()
				p, err := first.Requeue(ctx, 30*time.Second)
				requeued <- acquired{p: p, err: err}
			}()
			select {
			case <-queued: // waits in the fallback queue: the other upstream is busy
			case r := <-requeued:
				if r.p != nil {
					defer r.p.Release()
				}
				t.Fatalf("the requeued request was answered while its upstream cools and the other runs a request: upstream %q (refused %q, local %v), err %v",
					upstreamOf(r.p), refused, r.p != nil && r.p.Local(), r.err)
			case <-time.After(10 * time.Second):
				t.Fatal("the requeued request never queued")
			}
			other.Release()
			var r acquired
			select {
			case r = <-requeued:
			case <-time.After(15 * time.Second):
				t.Fatal("the requeued request was never answered once the other upstream was free")
			}
			require.NoError(t, r.err)
			defer r.p.Release()
			assert.NotEqual(t, refused, r.p.Upstream(), "served on the upstream that had just refused it")
		})
	}
}
