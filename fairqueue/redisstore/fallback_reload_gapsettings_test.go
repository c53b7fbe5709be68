package redisstore_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
	"github.com/fair-queue/caddy-fair-queue/internal/redistest"
)

// docs/failures.md, "When Redis fails": a reload during the outage that
// drops local (fail_closed, fail_open) and lowers the capacity, then
// Redis back: the requests that come before the heartbeat that has Redis
// count the fallback queue's permits wait in that fallback queue, under
// the reload's settings, as they would under a reload that kept local.
// Under those of before the reload, it granted them beside the local
// permit running, above the new permits (2 lowered to 1) or the new
// tenant cap (none lowered to 1): two at once where the settings in
// force allow one.
func TestARequestInTheGapAfterAReloadThatDroppedTheFallbackWaitsUnderTheReloadsSettings(t *testing.T) {
	cases := []struct {
		name   string
		before fairqueue.Config
		lower  func(*fairqueue.Config)
		req    fairqueue.Request
	}{
		{"permits", fairqueue.Config{Permits: 2, LocalPermits: 2},
			func(c *fairqueue.Config) { c.Permits, c.LocalPermits = 1, 0 }, fairqueue.Request{}},
		{"tenant_cap", fairqueue.Config{Permits: 2, LocalPermits: 2, Fair: true},
			func(c *fairqueue.Config) { c.MaxInFlightPerTenant = 1 }, fairqueue.Request{Tenant: "t"}},
	}
	for _, c := range cases {
		for _, policy := range []string{"fail_closed", "fail_open"} {
			t.Run(c.name+"/"+policy, func(t *testing.T) {
				srv := redistest.Start(t)
				name := "fbgapsettings" + c.name + policy
				n, hb, p1 := gapNodeOf(t, srv, name, c.before, c.req)

				reloaded := n.q.Config()
				reloaded.Fallback, reloaded.LocalPermits, reloaded.FailOpen = nil, 0, policy == "fail_open"
				c.lower(&reloaded)
				require.NoError(t, n.q.Reconfigure(reloaded))
				hb.intoTheGap(t, n, srv)

				r2 := make(chan acquired, 1)
				go func() {
					p, err := n.q.Acquire(context.Background(), c.req)
					r2 <- acquired{p: p, err: err}
				}()
				select {
				case r := <-r2:
					if r.p != nil {
						r.p.Release()
						t.Fatalf("a request in the gap was granted (local %v) beside the local permit running: 2 at once where the reload allows 1",
							r.p.Local())
					}
					t.Fatalf("a request was refused while Redis answered: %v", r.err)
				case <-time.After(time.Second):
				}

				// The heartbeat has Redis count p1; the request, moved into
				// Redis's queue, is granted there once p1 ends.
				close(hb.release)
				rdb := srv.Client(t)
				eventually(t, 20*time.Second, func() bool {
					return slices.Equal(readState(t, rdb, name).Holders, []string{p1.Ticket()})
				}, "Redis never counted the local permit alone")
				p1.Release()
				var r acquired
				select {
				case r = <-r2:
				case <-time.After(20 * time.Second):
					t.Fatal("the request was never answered once p1 ended")
				}
				require.NoError(t, r.err)
				defer r.p.Release()
				assert.False(t, r.p.Local(), "served by the fallback queue")
			})
		}
	}
}
