package redisstore_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
	"github.com/fair-queue/caddy-fair-queue/fairqueue/redisstore"
	"github.com/fair-queue/caddy-fair-queue/internal/redistest"
)

// The last leave that keeps the tombstones (a call may still reach
// Redis late) leaves them in a key that expires by itself, also where
// that key was written while instances lived (a key with no expiry
// then): tombstones of a cancelled ticket, or of an earlier instance
// whose own call may come late. Before, such a key stayed for good.
func TestTombstonesKeptByTheLastLeaveExpire(t *testing.T) {
	srv := redistest.Start(t)
	rdb := srv.Client(t)
	l := fairqueue.Limits{Permits: 1, Lease: 20 * time.Second}
	tk := func(id, node string) fairqueue.TicketArgs {
		return fairqueue.TicketArgs{ID: id, Node: node, Limits: l}
	}
	// failCall sends a call its client gives up on: Redis may run it
	// later, as far as the store knows.
	failCall := func(t *testing.T, s *redisstore.Store, node string) {
		gaveUp, cancel := context.WithCancel(context.Background())
		cancel()
		_, err := s.Acquire(gaveUp, tk(node+":late", node))
		require.Error(t, err)
	}
	for _, tc := range []struct {
		name, key string
		run       func(t *testing.T, name string)
	}{
		{"an earlier leave unsure, the last one sure", "tombttlearlier", func(t *testing.T, name string) {
			ctx := context.Background()
			a := redisstore.New(rdb, name, redisstore.Options{})
			b := redisstore.New(rdb, name, redisstore.Options{})
			require.NoError(t, a.Open(ctx, "a", nopListener{}))
			require.NoError(t, b.Open(ctx, "b", nopListener{}))
			t.Cleanup(func() { _ = a.Close(); _ = b.Close() })
			_, err := a.Acquire(ctx, tk("a:1", "a"))
			require.NoError(t, err)
			_, err = b.Acquire(ctx, tk("b:1", "b"))
			require.NoError(t, err)
			failCall(t, b, "b")
			require.NoError(t, b.Leave(ctx, "b", l))
			require.NoError(t, a.Leave(ctx, "a", l))
		}},
		{"a cancelled ticket's tombstone, then an unsure last leave", "tombttlcancel", func(t *testing.T, name string) {
			ctx := context.Background()
			a := redisstore.New(rdb, name, redisstore.Options{})
			require.NoError(t, a.Open(ctx, "a", nopListener{}))
			t.Cleanup(func() { _ = a.Close() })
			res, err := a.Acquire(ctx, tk("a:1", "a"))
			require.NoError(t, err)
			require.True(t, res.Granted)
			res, err = a.Acquire(ctx, tk("a:2", "a"))
			require.NoError(t, err)
			require.False(t, res.Granted)
			c := tk("a:2", "a")
			c.Tombstone = true
			require.NoError(t, a.Cancel(ctx, c))
			failCall(t, a, "a")
			require.NoError(t, a.Leave(ctx, "a", l))
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			name := tc.key
			tc.run(t, name)
			ctx := context.Background()
			for _, k := range srv.Keys(t, "*"+name+"*") {
				ttl := rdb.PTTL(ctx, k).Val()
				assert.True(t, ttl > 0 && ttl <= max(redisstore.TombstoneTTL, l.Lease),
					"key %s left for good (PTTL %v) after the last leave", k, ttl)
			}
		})
	}
}
