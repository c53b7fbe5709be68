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

// Every script with a pool is idempotent by ticket: a cooldown, a
// requeue and a re-added holder count once however often they are sent.
func TestPoolScriptsAreIdempotentByTicket(t *testing.T) {
	rdb, s := openStore(t, "poolidem")
	ctx := context.Background()
	l := fairqueue.Limits{Permits: 3, Lease: 10 * time.Second,
		Upstreams: []fairqueue.Upstream{{Dial: "a:1", Permits: 1}, {Dial: "b:1", Permits: 1}}}
	tk := func(n int) fairqueue.TicketArgs {
		return fairqueue.TicketArgs{ID: fmt.Sprintf("n1:%d", n), Node: "n1", Limits: l, Cost: 1}
	}
	dump := func() string {
		out := stateString(readState(t, rdb, "poolidem"))
		for _, k := range []string{"uheld", "ulast"} {
			m, err := rdb.HGetAll(ctx, s.Tag()+":"+k).Result()
			require.NoError(t, err)
			out += fmt.Sprintf(" %s=%v", k, m)
		}
		z, err := rdb.ZRange(ctx, s.Tag()+":ucool", 0, -1).Result()
		require.NoError(t, err)
		return out + fmt.Sprintf(" ucool=%v", z)
	}
	twice := func(name string, f func() error) {
		t.Helper()
		require.NoError(t, f(), name)
		once := dump()
		require.NoError(t, f(), name+" again")
		assert.Equal(t, once, dump(), "%s run twice", name)
	}
	ups := map[string]string{}
	for i := 1; i <= 3; i++ {
		twice(fmt.Sprintf("acquire %d", i), func() error {
			r, err := s.Acquire(ctx, tk(i))
			if r.Upstream != "" {
				ups[tk(i).ID] = r.Upstream
			}
			return err
		})
	}
	require.Equal(t, map[string]string{"n1:1": "a:1", "n1:2": "b:1"}, ups, "one grant per upstream, in list order")
	twice("release cooling a", func() error {
		rel := tk(1)
		rel.Cool, rel.CoolFor = "a:1", 5*time.Second
		return s.Release(ctx, rel)
	})
	// a cools: n1:3 still waits although a has a free permit.
	st := readState(t, rdb, "poolidem")
	assert.Equal(t, []string{"n1:3"}, st.Waiting, "a cooling: nobody is granted on it")
	twice("requeue n1:2 as n1:4", func() error {
		r := fairqueue.RequeueArgs{TicketArgs: tk(4), Old: "n1:2", Seq: 2}
		r.Correction = -1
		res, err := s.Requeue(ctx, r)
		assert.False(t, res.Gone)
		return err
	})
	// n1:4 took n1:2's place (seq 2, before n1:3) and its freed permit on b.
	st = readState(t, rdb, "poolidem")
	assert.Equal(t, []string{"n1:4"}, st.Holders, "the requeued ticket is served first, at its place")
	assert.Equal(t, []string{"n1:3"}, st.Waiting)
	held, err := rdb.HGetAll(ctx, s.Tag()+":uheld").Result()
	require.NoError(t, err)
	assert.Equal(t, map[string]string{"n1:4": "b:1"}, held)
	twice("heartbeat", func() error {
		_, err := s.Heartbeat(ctx, fairqueue.HeartbeatArgs{Node: "n1", Limits: l, Held: []string{"n1:4"},
			Upstreams: map[string]string{"n1:4": "b:1"}})
		return err
	})
}

// A holder Redis lost (a restart without persistence) is counted again
// by its node's heartbeat on its upstream too, so the upstream is not
// granted past its permits afterwards.
func TestPoolHolderReaddedAfterDataLossCountsOnItsUpstream(t *testing.T) {
	rdb, s := openStore(t, "poolloss")
	ctx := context.Background()
	l := fairqueue.Limits{Permits: 2, Lease: 10 * time.Second,
		Upstreams: []fairqueue.Upstream{{Dial: "a:1", Permits: 1}, {Dial: "b:1", Permits: 1}}}
	r, err := s.Acquire(ctx, fairqueue.TicketArgs{ID: "n1:1", Node: "n1", Limits: l})
	require.NoError(t, err)
	require.Equal(t, "a:1", r.Upstream)
	require.NoError(t, rdb.FlushAll(ctx).Err())
	_, err = s.Heartbeat(ctx, fairqueue.HeartbeatArgs{Node: "n1", Limits: l, Held: []string{"n1:1"},
		Upstreams: map[string]string{"n1:1": "a:1"}, Epoch: r.Epoch, Beat: 1})
	require.NoError(t, err)
	r, err = s.Acquire(ctx, fairqueue.TicketArgs{ID: "n1:2", Node: "n1", Limits: l})
	require.NoError(t, err)
	assert.Equal(t, "b:1", r.Upstream, "a still runs n1:1: the next grant goes to b")
	r, err = s.Acquire(ctx, fairqueue.TicketArgs{ID: "n1:3", Node: "n1", Limits: l})
	require.NoError(t, err)
	assert.False(t, r.Granted, "both upstreams full")
}

// A release from a node without the pool (a reload removing it) takes
// the holder's upstream entry too: the upstream is free at once, and
// nothing leaks. Such an entry left behind counted a holder of no
// upstream on one only (TestANodeWithoutThePoolLeavesNoUpstreamEntryBehind).
func TestPoolEntryReleasedByANodeWithoutThePoolGoes(t *testing.T) {
	rdb, s := openStore(t, "pooltidy")
	ctx := context.Background()
	pool := fairqueue.Limits{Permits: 1, Lease: 10 * time.Second, Upstreams: []fairqueue.Upstream{{Dial: "a:1", Permits: 1}}}
	plain := fairqueue.Limits{Permits: 1, Lease: 10 * time.Second}
	_, err := s.Acquire(ctx, fairqueue.TicketArgs{ID: "n1:1", Node: "n1", Limits: pool})
	require.NoError(t, err)
	require.NoError(t, s.Release(ctx, fairqueue.TicketArgs{ID: "n1:1", Node: "n1", Limits: plain}))
	r, err := s.Acquire(ctx, fairqueue.TicketArgs{ID: "n1:2", Node: "n1", Limits: pool})
	require.NoError(t, err)
	assert.True(t, r.Granted, "a is free")
	assert.Equal(t, "a:1", r.Upstream)
	require.NoError(t, s.Leave(ctx, "n1", pool))
	keys, err := rdb.Keys(ctx, s.Tag()+"*").Result()
	require.NoError(t, err)
	assert.Empty(t, keys)
}

// A reload gives a queue a pool while a node hands a permit on locally
// (its config had none): before the transfer lands, the node's first
// call under the pool grants the same waiter again, on an upstream (its
// own waiter keeps the upstream its call chose: its heartbeat has not
// named the pool yet). The waiter runs where the node's plain grant sent
// it, not there: once the transfer lands it counts on every upstream, as
// a holder granted without the pool does, and the next waiter is not
// sent to the upstream it may run on. (Another node's call grants it on
// no upstream at once: n1 named no pool, TestAWaiterOfANodeWithoutThe
// PoolGrantedByOneWithItCountsOnEveryUpstream.)
func TestLocalHandoffRegrantedOnAPoolMeanwhileCountsOnEveryUpstream(t *testing.T) {
	ctx := context.Background()
	rdb := redistest.Start(t).Client(t)
	s1, _ := openHeads(t, rdb, "xpool", "n1")
	plain := fairqueue.Limits{Permits: 1, Lease: 10 * time.Second}
	pooled := fairqueue.Limits{Permits: 3, Lease: 10 * time.Second,
		Upstreams: []fairqueue.Upstream{{Dial: "a:1", Permits: 1}, {Dial: "b:1", Permits: 2}}}
	acquire := func(s *redisstore.Store, id string, l fairqueue.Limits) fairqueue.AcquireResult {
		r, err := s.Acquire(ctx, ticketOf(id, l))
		require.NoError(t, err)
		return r
	}
	require.True(t, acquire(s1, "n1:1", plain).Granted)
	require.False(t, acquire(s1, "n1:2", plain).Granted)
	// n1 starts n1:2 on n1:1's permit (no upstream named) and sends the
	// transfer; meanwhile a reload gives n1 the pool, and the dispatch of
	// its first request under it grants n1:2 again, on b:1 (a:1 is full:
	// n1:1 counts on every upstream, and so is b:1 then).
	require.False(t, acquire(s1, "n1:3", pooled).Granted)
	up, err := rdb.HGet(ctx, s1.Tag()+":uheld", "n1:2").Result()
	require.NoError(t, err, "n1:2 granted again under the pool")
	require.Equal(t, "b:1", up)
	// The transfer lands: n1:1's permit is free, and n1's next call
	// grants n1:3, not on a:1, where n1:2 may run.
	require.NoError(t, s1.Transfer(ctx, ticketOf("n1:1", plain), "n1:2"))
	assert.False(t, rdb.HExists(ctx, s1.Tag()+":uheld", "n1:2").Val(), "n1:2 still placed on b:1")
	acquire(s1, "n1:4", pooled)
	assert.Equal(t, "b:1", rdb.HGet(ctx, s1.Tag()+":uheld", "n1:3").Val(), "n1:3 granted on a:1, above its 1 permit with n1:2")
}
