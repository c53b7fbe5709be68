package redisstore_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
	"github.com/fair-queue/caddy-fair-queue/internal/redistest"
)

// docs/failures.md, "When Redis fails": a reload during the outage that
// drops local (fail_closed, fail_open) leaves the requests already
// waiting in the fallback queue waiting there, while Redis is still
// down, under the reload's settings: a lowered permits or tenant cap
// holds them until the local permits running are under it; a raised
// permits gives the fallback queue no more permits than it had (the
// local_permits 2 the reload drops). Permits 2, local_permits 2: p1 and
// p2 run on the fallback queue, w waits there as the reload lands.
func TestFallbackWaitersAtAReloadThatDropsTheFallbackWaitUnderItsSettingsWhileRedisIsDown(t *testing.T) {
	t.Parallel() // its own redis-server: it waits on it, not on the CPU
	cases := []struct {
		name   string
		before fairqueue.Config
		reload func(*fairqueue.Config)
		req    fairqueue.Request
		beside bool // the reload allows w beside p1
	}{
		{"permits_lowered", fairqueue.Config{Permits: 2, LocalPermits: 2},
			func(c *fairqueue.Config) { c.Permits = 1 }, fairqueue.Request{}, false},
		{"tenant_cap_lowered", fairqueue.Config{Permits: 2, LocalPermits: 2, Fair: true},
			func(c *fairqueue.Config) { c.MaxInFlightPerTenant = 1 }, fairqueue.Request{Tenant: "t"}, false},
		{"permits_raised", fairqueue.Config{Permits: 2, LocalPermits: 2},
			func(c *fairqueue.Config) { c.Permits = 4 }, fairqueue.Request{}, true},
	}
	for _, c := range cases {
		for _, policy := range []string{"fail_closed", "fail_open"} {
			t.Run(c.name+"/"+policy, func(t *testing.T) {
				t.Parallel()
				srv := redistest.Start(t)
				n, _, p1 := gapNodeOf(t, srv, "fbwaitsettings"+c.name+policy, c.before, c.req)
				p2, err := n.q.Acquire(context.Background(), c.req)
				require.NoError(t, err)
				require.True(t, p2.Local(), "served by the fallback queue while Redis is down")
				t.Cleanup(p2.Release)

				queued := make(chan struct{}, 1)
				rw := make(chan acquired, 1)
				req := c.req
				req.OnQueued = func(fairqueue.Waiting) {
					select {
					case queued <- struct{}{}:
					default:
					}
				}
				go func() {
					p, err := n.q.Acquire(context.Background(), req)
					rw <- acquired{p: p, err: err}
				}()
				select {
				case <-queued:
				case r := <-rw:
					if r.p != nil {
						r.p.Release()
					}
					t.Fatalf("w was answered beside p1 and p2 on local_permits 2 (err %v)", r.err)
				case <-time.After(10 * time.Second):
					t.Fatal("w never queued in the fallback queue")
				}

				reloaded := n.q.Config()
				reloaded.Fallback, reloaded.LocalPermits, reloaded.FailOpen = nil, 0, policy == "fail_open"
				c.reload(&reloaded)
				require.NoError(t, n.q.Reconfigure(reloaded))
				notAnswered := func(what string) {
					t.Helper()
					select {
					case r := <-rw:
						if r.p != nil {
							r.p.Release()
						}
						t.Fatalf("w was answered %s (err %v)", what, r.err)
					case <-time.After(time.Second):
					}
				}
				notAnswered("beside p1 and p2: more permits than the fallback queue had")
				p2.Release()
				if !c.beside {
					notAnswered("beside p1, above the reload's settings")
					p1.Release()
				}
				select {
				case r := <-rw:
					require.NoError(t, r.err)
					defer r.p.Release()
					assert.True(t, r.p.Local(), "served by the fallback queue: Redis is down")
				case <-time.After(20 * time.Second):
					t.Fatal("w was never served once the reload's settings allowed it")
				}
			})
		}
	}
}
