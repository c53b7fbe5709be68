package redisstore_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
)

// A waiter queued with its weight (kv_tokens) and granted by a node
// whose config counts no tokens (a rolling change, or a reload that
// turns kv_tokens off) leaves no weight behind: the queue lives on, and
// an entry per such waiter would stay as long as it does.
func TestAWaiterGrantedWithoutTokensLeavesNoWeightBehind(t *testing.T) {
	rdb, s := openStore(t, "tokoff")
	ctx := context.Background()
	for _, c := range []struct{ fair, transfer bool }{{false, false}, {true, false}, {false, true}} {
		fair := c.fair
		counted := fairqueue.Limits{Permits: 1, Tokens: 1000, Lease: 10 * time.Second}
		plain := fairqueue.Limits{Permits: 1, Lease: 10 * time.Second}
		id := func(n string) string {
			if fair {
				return "n1:" + n + ":t"
			}
			return "n1:" + n
		}
		holder := fairqueue.TicketArgs{ID: id("1"), Node: "n1", Limits: counted, Cost: 1, Tokens: 100}
		r, err := s.Acquire(ctx, holder)
		require.NoError(t, err)
		require.True(t, r.Granted)
		waiter := fairqueue.TicketArgs{ID: id("2"), Node: "n1", Limits: counted, Cost: 1, Tokens: 100}
		r, err = s.Acquire(ctx, waiter)
		require.NoError(t, err)
		require.False(t, r.Granted)
		require.NotEmpty(t, rdb.HGetAll(ctx, s.Tag()+":tok").Val(), "the waiter's weight is recorded")

		// The release under a config without tokens grants the waiter,
		// or the node hands its permit on to it (a local handoff).
		holder.Limits = plain
		if c.transfer {
			require.NoError(t, s.Transfer(ctx, holder, waiter.ID))
		} else {
			require.NoError(t, s.Release(ctx, holder))
		}
		waiter.Limits = plain
		require.NoError(t, s.Release(ctx, waiter))
		_, err = s.Reconcile(ctx, "n1", plain)
		require.NoError(t, err)
		assert.Empty(t, rdb.HGetAll(ctx, s.Tag()+":tok").Val(), "%+v: weights left for tickets no longer waiting", c)
		assert.Empty(t, rdb.ZRange(ctx, s.Tag()+":holders", 0, -1).Val())
	}
}
