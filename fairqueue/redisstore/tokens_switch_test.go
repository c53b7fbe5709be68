package redisstore_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
)

// A waiter queued with its weight (kv_tokens) and what it asks, and
// granted by a node whose config counts no tokens (a rolling change, or
// a reload that turns kv_tokens off), leaves no weight and no ask behind:
// the queue lives on, and an entry per such waiter would stay as long as
// it does. Looked at before a reconcile, which drops the whole hash once
// nobody waits.
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
		waiter := fairqueue.TicketArgs{ID: id("2"), Node: "n1", Limits: counted, Cost: 1, Tokens: 100, Asks: 150}
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
		assert.Empty(t, rdb.HGetAll(ctx, s.Tag()+":tok").Val(), "%+v: the granted waiter's weight or ask left", c)
		snap, err := s.Inspect(ctx, 0, 0)
		require.NoError(t, err)
		assert.Equal(t, 100, snap.TokensHeld, "%+v: weighs its weight where the grant counts no tokens", c)
		waiter.Limits = plain
		require.NoError(t, s.Release(ctx, waiter))
		_, err = s.Reconcile(ctx, "n1", plain)
		require.NoError(t, err)
		assert.Empty(t, rdb.HGetAll(ctx, s.Tag()+":tok").Val(), "%+v: weights left for tickets no longer waiting", c)
		assert.Empty(t, rdb.ZRange(ctx, s.Tag()+":holders", 0, -1).Val())
	}
}
