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
// force allow one. It gives no more permits than it had, though: the
// reload's share of the capacity is the instance's under local, and the
// local_permits the reload drops bounded the fallback queue.
func TestARequestInTheGapAfterAReloadThatDroppedTheFallbackWaitsUnderTheReloadsSettings(t *testing.T) {
	t.Parallel() // its own redis-server: it waits on it, not on the CPU
	cases := []struct {
		name   string
		before fairqueue.Config
		lower  func(*fairqueue.Config)
		req    fairqueue.Request
		beside bool // Redis may grant the request beside p1 once it counts p1
	}{
		{"permits", fairqueue.Config{Permits: 2, LocalPermits: 2},
			func(c *fairqueue.Config) { c.Permits, c.LocalPermits = 1, 0 }, fairqueue.Request{}, false},
		{"tenant_cap", fairqueue.Config{Permits: 2, LocalPermits: 2, Fair: true},
			func(c *fairqueue.Config) { c.MaxInFlightPerTenant = 1 }, fairqueue.Request{Tenant: "t"}, false},
		// The reload drops local_permits 1 with local: the fallback queue
		// keeps to it, not to the instance's share of permits 2.
		{"local_permits", fairqueue.Config{Permits: 2, LocalPermits: 1},
			func(*fairqueue.Config) {}, fairqueue.Request{}, true},
	}
	for _, c := range cases {
		for _, policy := range []string{"fail_closed", "fail_open"} {
			t.Run(c.name+"/"+policy, func(t *testing.T) {
				t.Parallel()
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
						t.Fatalf("a request in the gap was granted (local %v) beside the local permit running: 2 at once where the fallback queue allows 1",
							r.p.Local())
					}
					t.Fatalf("a request was refused while Redis answered: %v", r.err)
				case <-time.After(time.Second):
				}

				// The heartbeat has Redis count p1; the request moves into
				// Redis's queue, and is granted there: beside p1 where the
				// reload allows two, or else once p1 ends.
				close(hb.release)
				rdb := srv.Client(t)
				var r acquired
				answered := false
				eventually(t, 20*time.Second, func() bool {
					if !answered {
						select {
						case r = <-r2:
							answered = true
						default:
						}
					}
					st := readState(t, rdb, name)
					return slices.Contains(st.Holders, p1.Ticket()) && (answered || len(st.Waiting) == 1)
				}, "Redis never counted the local permit, nor took the request")
				if answered && !c.beside {
					if r.p != nil {
						r.p.Release()
					}
					t.Fatalf("the request was answered while p1 held what the reload allows: %v", r.err)
				}
				p1.Release()
				if !answered {
					select {
					case r = <-r2:
					case <-time.After(20 * time.Second):
						t.Fatal("the request was never answered once p1 ended")
					}
				}
				require.NoError(t, r.err)
				defer r.p.Release()
				assert.False(t, r.p.Local(), "served by the fallback queue")
			})
		}
	}
}

// docs/failures.md, "When Redis fails": a reload during the outage that
// sets fail_open in place of local, a request fail_open lets in that
// still runs when Redis answers again: the fallback queue that serves
// the requests of the gap before the heartbeat counts it, as the one a
// reload that sets local again does. Uncounted, it granted its free
// permit beside it: permits 2, local_permits 2, the local p1 and the
// fail-open f running, and a third request at once.
func TestARequestInTheGapAfterAReloadToFailOpenCountsTheFailOpenRequestsRunning(t *testing.T) {
	t.Parallel() // its own redis-server: it waits on it, not on the CPU
	srv := redistest.Start(t)
	const name = "fbgapfailopen"
	n, hb, p1 := gapNodeOf(t, srv, name, fairqueue.Config{Permits: 2, LocalPermits: 2}, fairqueue.Request{})
	reloaded := n.q.Config()
	reloaded.Fallback, reloaded.LocalPermits, reloaded.FailOpen = nil, 0, true
	require.NoError(t, n.q.Reconfigure(reloaded))
	f, err := n.q.Acquire(context.Background(), fairqueue.Request{})
	require.NoError(t, err)
	require.True(t, f.FailOpen(), "let in by fail_open while Redis is down")
	defer f.Release()
	hb.intoTheGap(t, n, srv)

	r2 := make(chan acquired, 1)
	go func() {
		p, err := n.q.Acquire(context.Background(), fairqueue.Request{})
		r2 <- acquired{p: p, err: err}
	}()
	select {
	case r := <-r2:
		if r.p != nil {
			r.p.Release()
			t.Fatalf("a request in the gap was granted (local %v) beside the local and the fail-open request running: 3 at once on permits 2", r.p.Local())
		}
		t.Fatalf("a request was refused while Redis answered: %v", r.err)
	case <-time.After(time.Second):
	}

	// The heartbeat has Redis count both; the request moves into Redis's
	// queue, and is granted there once p1 ends.
	close(hb.release)
	rdb := srv.Client(t)
	eventually(t, 20*time.Second, func() bool {
		st := readState(t, rdb, name)
		return len(st.Holders) == 2 && len(st.Waiting) == 1
	}, "Redis never counted the local and the fail-open request, nor took the request")
	p1.Release()
	select {
	case r := <-r2:
		require.NoError(t, r.err)
		defer r.p.Release()
		assert.False(t, r.p.Local(), "served by the fallback queue")
	case <-time.After(20 * time.Second):
		t.Fatal("the request was never answered once p1 ended")
	}
}
