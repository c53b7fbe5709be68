package redisstore_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
)

// The virtual time (K.vtime) is where a tenant that starts to wait with
// no flow ready starts its usage counter. Evicted under maxmemory, it
// read 0: a new tenant started below every tenant with a request
// running, whatever they had used, and those waited, passed by it, for
// as long as the queue had run (in a busy queue, out to their max_wait).
// Their requests are served where they are without the eviction, or up
// to one request's cost of theirs earlier (the virtual time is read
// again from the active tenants' counters, which include their last
// charge).
func TestATenantThatStartsAfterTheVirtualTimeWasEvictedIsNotAheadOfTheOthers(t *testing.T) {
	t.Run("running", func(t *testing.T) { evictTheVirtualTime(t, true) })
	// Tenant a idle above the virtual time, no flow active (the permit
	// held by a FIFO ticket, as while a reload turns tenants on).
	t.Run("idle", func(t *testing.T) { evictTheVirtualTime(t, false) })
}

// evictTheVirtualTime runs TestATenantThatStartsAfterTheVirtualTimeWasEvictedIsNotAheadOfTheOthers,
// tenant a running its second request at the eviction or idle.
func evictTheVirtualTime(t *testing.T, running bool) {
	order := func(evict bool) []string {
		rdb, s := openStore(t, fmt.Sprintf("vtimeevicted%v%v", running, evict))
		ctx := context.Background()
		l := fairqueue.Limits{Permits: 1, Lease: 10 * time.Second}
		tk := func(id string, cost float64) fairqueue.TicketArgs {
			return fairqueue.TicketArgs{ID: id, Node: "n1", Limits: l, Cost: cost}
		}
		queued := func(a fairqueue.TicketArgs) {
			t.Helper()
			r, err := s.Acquire(ctx, a)
			require.NoError(t, err)
			require.False(t, r.Granted, "no permit free")
		}
		// Tenant a uses 10 a request: its second grant moves the virtual
		// time to 10, where it starts, and its counter to 20.
		a1 := tk("n1:1:a.0", 10)
		acquireGranted(t, s, a1)
		require.NoError(t, s.Release(ctx, a1))
		held := tk("n1:2:a.0", 10)
		acquireGranted(t, s, held)
		if !running {
			require.NoError(t, s.Release(ctx, held))
			held = tk("n1:21", 1)
			acquireGranted(t, s, held)
		}
		if evict {
			require.NoError(t, rdb.Del(ctx, s.Tag()+":vtime").Err())
		}
		for i := range 15 {
			queued(tk(fmt.Sprintf("n1:%d:b.0", 3+i), 1))
		}
		queued(tk("n1:20:a.0", 10))
		var out []string
		for range 16 {
			require.NoError(t, s.Release(ctx, held))
			snap, err := s.Inspect(ctx, 0, 0)
			require.NoError(t, err)
			require.Len(t, snap.Holders, 1)
			held = tk(snap.Holders[0].Ticket, 0)
			out = append(out, held.ID)
		}
		require.NoError(t, s.Release(ctx, held))
		return out
	}
	want := slices.Index(order(false), "n1:20:a.0")
	require.Positive(t, want)
	got := order(true)
	at := slices.Index(got, "n1:20:a.0")
	assert.LessOrEqual(t, at, want, "a's request served later than without the eviction: %v", got)
	assert.GreaterOrEqual(t, at, want-10, "a's request served more than one request's cost (10) earlier: %v", got)
}
