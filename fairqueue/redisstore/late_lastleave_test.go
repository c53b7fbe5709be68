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

// A call of the last instance fails on its side (its client gave up on
// it: a frozen Redis during a shutdown), the instance leaves (the last
// leave), and Redis runs the call only then. Redis is left with no key
// of the queue that stays: what remains expires by itself within a
// tombstone's life (or a lease), and the late call brought nothing back
// to life. Each kind of call an instance sends is tried.
func TestCallRunAfterTheLastLeaveLeavesNoKeyForGood(t *testing.T) {
	srv := redistest.Start(t)
	rdb := srv.Client(t)
	l := fairqueue.Limits{Permits: 1, Lease: 20 * time.Second}
	tk := func(id string) fairqueue.TicketArgs { return fairqueue.TicketArgs{ID: id, Node: "a", Limits: l} }
	for _, tc := range []struct {
		name string
		// before runs on the live queue (a:1 holds the permit); call is
		// the call that fails, then runs late.
		before func(t *testing.T, s *redisstore.Store)
		call   func(ctx context.Context, s *redisstore.Store) error
	}{
		{"acquire", nil, func(ctx context.Context, s *redisstore.Store) error {
			_, err := s.Acquire(ctx, tk("a:2"))
			return err
		}},
		{"heartbeat", nil, func(ctx context.Context, s *redisstore.Store) error {
			_, err := s.Heartbeat(ctx, fairqueue.HeartbeatArgs{Node: "a", Limits: l, Held: []string{"a:1"}, Beat: 2})
			return err
		}},
		{"requeue", nil, func(ctx context.Context, s *redisstore.Store) error {
			_, err := s.Requeue(ctx, fairqueue.RequeueArgs{TicketArgs: tk("a:2"), Old: "a:1", Seq: 1})
			return err
		}},
		{"transfer", func(t *testing.T, s *redisstore.Store) {
			res, err := s.Acquire(context.Background(), tk("a:2"))
			require.NoError(t, err)
			require.False(t, res.Granted)
		}, func(ctx context.Context, s *redisstore.Store) error {
			mv := tk("a:1")
			mv.Tombstone = true
			return s.Transfer(ctx, mv, "a:2")
		}},
		{"release", nil, func(ctx context.Context, s *redisstore.Store) error {
			return s.Release(ctx, tk("a:1"))
		}},
		{"cancel", nil, func(ctx context.Context, s *redisstore.Store) error {
			c := tk("a:2")
			c.Tombstone = true
			return s.Cancel(ctx, c)
		}},
		{"reconcile", nil, func(ctx context.Context, s *redisstore.Store) error {
			_, err := s.Reconcile(ctx, "a", l)
			return err
		}},
		{"adapt", nil, func(ctx context.Context, s *redisstore.Store) error {
			_, err := s.Adapt(ctx, fairqueue.AdaptArgs{Node: "a", Floor: 0.25, Decrease: 0.5, Step: 0.1,
				BreachShare: 0.1, Interval: time.Second, MinSamples: 1,
				Reports: []fairqueue.AdaptReport{{Samples: 5, Over: 5}}})
			return err
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			name := "lastleave" + tc.name
			ctx := context.Background()
			s := redisstore.New(rdb, name, redisstore.Options{})
			require.NoError(t, s.Open(ctx, "a", nopListener{}))
			t.Cleanup(func() { _ = s.Close() })
			res, err := s.Acquire(ctx, tk("a:1"))
			require.NoError(t, err)
			require.True(t, res.Granted)
			if tc.before != nil {
				tc.before(t, s)
			}
			// The call fails on the instance's side: its client gave up.
			gaveUp, cancel := context.WithCancel(ctx)
			cancel()
			require.Error(t, tc.call(gaveUp, s))
			require.NoError(t, s.Leave(ctx, "a", l))

			// Redis runs the call now, after the last leave.
			_ = tc.call(ctx, s)
			for _, k := range srv.Keys(t, "*"+name+"*") {
				ttl := rdb.PTTL(ctx, k).Val()
				assert.True(t, ttl > 0 && ttl <= max(redisstore.TombstoneTTL, l.Lease),
					"key %s left for good (PTTL %v) by a late %s after the last leave", k, ttl, tc.name)
			}
			assert.Empty(t, rdb.ZRange(ctx, redisstore.TagOf("", name)+":nodes", 0, -1).Val(),
				"a late %s after the last leave brought its instance back to life", tc.name)
		})
	}
}
