package redisstore_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
	"github.com/fair-queue/caddy-fair-queue/fairqueue/redisstore"
	"github.com/fair-queue/caddy-fair-queue/internal/redistest"
)

// A node that crashed with waiters its survivors could not serve (its
// lease over, every upstream of the pool cooling, or more of them than
// one dispatch drops) leaves nothing in Redis once the last live node
// leaves: nobody is left to drop them later.
func TestCrashedNodesWaitersLeaveNoKeysAfterTheLastNodeLeaves(t *testing.T) {
	t.Parallel() // its own redis-server: it waits on it, not on the CPU
	ctx := context.Background()
	cases := []struct {
		name    string
		limits  fairqueue.Limits
		waiters int
		cool    bool
	}{
		{"pool cooling", fairqueue.Limits{Permits: 2, Upstreams: []fairqueue.Upstream{{Dial: "a:1", Permits: 1}}}, 1, true},
		{"fair pool cooling", fairqueue.Limits{Permits: 2, MaxInFlightPerTenant: 1,
			Upstreams: []fairqueue.Upstream{{Dial: "a:1", Permits: 1}, {Dial: "b:1", Permits: 1}}}, 3, true},
		{"many waiters", fairqueue.Limits{Permits: 1}, 2500, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			srv := redistest.Start(t)
			rdb := srv.Client(t)
			s := redisstore.New(rdb, "crash", redisstore.Options{})
			require.NoError(t, s.Open(ctx, "live", nopListener{}))
			t.Cleanup(func() { _ = s.Close() })
			live, dead := c.limits, c.limits
			live.Lease, dead.Lease = 10*time.Second, 300*time.Millisecond
			fair := c.limits.MaxInFlightPerTenant > 0
			id := func(node string, n int) string {
				if fair {
					return fmt.Sprintf("%s:%d:t%d", node, n, n%2)
				}
				return fmt.Sprintf("%s:%d", node, n)
			}

			// The live node holds every permit of the pool; the doomed
			// one queues behind it, then goes silent.
			var held []fairqueue.TicketArgs
			for i := 0; i < len(c.limits.Upstreams) || i == 0; i++ {
				tk := fairqueue.TicketArgs{ID: id("live", i), Node: "live", Limits: live, Cost: 1}
				r, err := s.Acquire(ctx, tk)
				require.NoError(t, err)
				require.True(t, r.Granted)
				tk.Cool = r.Upstream
				held = append(held, tk)
			}
			for i := 0; i < c.waiters; i++ {
				r, err := s.Acquire(ctx, fairqueue.TicketArgs{ID: id("dead", i), Node: "dead", Limits: dead, Cost: 1})
				require.NoError(t, err)
				require.False(t, r.Granted)
			}
			time.Sleep(3 * dead.Lease) // the dead node's lease runs out

			// A 429 cools each upstream as the live node's requests end,
			// then the live node stops.
			for _, tk := range held {
				if c.cool {
					tk.CoolFor = time.Minute
				} else {
					tk.Cool = ""
				}
				require.NoError(t, s.Release(ctx, tk))
			}
			require.NoError(t, s.Leave(ctx, "live", live))
			assert.Empty(t, srv.Keys(t, "*"), "keys left after the last live node left")
		})
	}
}
