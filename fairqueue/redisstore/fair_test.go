package redisstore_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
	"github.com/fair-queue/caddy-fair-queue/fairqueue/redisstore"
	"github.com/fair-queue/caddy-fair-queue/internal/redistest"
)

// Every script with fair tickets is idempotent by ticket, as with FIFO
// ones: a correction applies once however often its release is sent, a
// re-added holder is counted once, and the last leave deletes every key.
func TestFairScriptsAreIdempotentByTicket(t *testing.T) {
	rdb, s := openStore(t, "fairidem")
	ctx := context.Background()
	l := fairqueue.Limits{Permits: 1, Lease: 10 * time.Second, MaxInFlightPerTenant: 1}
	ticket := func(n int, flow string) fairqueue.TicketArgs {
		return fairqueue.TicketArgs{ID: fmt.Sprintf("n1:%d:%s", n, flow), Node: "n1", Limits: l, Cost: 1}
	}
	a1, a2, b1 := ticket(1, "aaaa.0"), ticket(2, "aaaa.0"), ticket(3, "bbbb.0")
	dump := func() string {
		out := stateString(readState(t, rdb, "fairidem"))
		for _, k := range []string{"fcount", "finf", "twait", "fticket"} {
			m, err := rdb.HGetAll(ctx, s.Tag()+":"+k).Result()
			require.NoError(t, err)
			out += fmt.Sprintf(" %s=%v", k, m)
		}
		for _, k := range []string{"fready", "fidle", "fwait"} {
			z, err := rdb.ZRangeWithScores(ctx, s.Tag()+":"+k, 0, -1).Result()
			require.NoError(t, err)
			out += fmt.Sprintf(" %s=%v", k, z)
		}
		v, _ := rdb.Get(ctx, s.Tag()+":vtime").Result()
		return out + " vtime=" + v
	}
	twice := func(name string, f func() error) {
		require.NoError(t, f(), name)
		once := dump()
		require.NoError(t, f(), name+" again")
		assert.Equal(t, once, dump(), "%s run twice", name)
	}
	twice("acquire granted", func() error { _, err := s.Acquire(ctx, a1); return err })
	twice("acquire queued behind the cap", func() error {
		r, err := s.Acquire(ctx, a2)
		assert.False(t, r.Granted)
		return err
	})
	twice("acquire of another tenant queued", func() error { _, err := s.Acquire(ctx, b1); return err })
	twice("heartbeat", func() error {
		_, err := s.Heartbeat(ctx, fairqueue.HeartbeatArgs{Node: "n1", Limits: l, Held: []string{a1.ID}})
		return err
	})
	corrected := a1
	corrected.Correction = 2.5
	twice("release with a correction", func() error { return s.Release(ctx, corrected) })
	c, err := rdb.HGet(ctx, s.Tag()+":fcount", "aaaa.0").Float64()
	require.NoError(t, err)
	assert.Equal(t, 1+2.5, c, "the correction applied once")
	assert.Equal(t, []string{b1.ID}, readState(t, rdb, "fairidem").Holders, "the other tenant, less used, is served first")
	twice("cancel of a waiter", func() error { return s.Cancel(ctx, a2) })
	twice("cancel of a holder", func() error { return s.Cancel(ctx, b1) })
	twice("reconcile", func() error { _, err := s.Reconcile(ctx, "n1", l); return err })
	twice("leave", func() error { return s.Leave(ctx, "n1", l) })
	keys, err := rdb.Keys(ctx, s.Tag()+"*").Result()
	require.NoError(t, err)
	assert.Empty(t, keys, "the last node's leave deletes everything")
}

// Usage past 10^9 is rebased: the virtual time and the counters are
// brought back near 0, their differences kept exactly.
func TestFairCountersAreRebasedBeforeTheyLosePrecision(t *testing.T) {
	rdb, s := openStore(t, "rebase")
	ctx := context.Background()
	l := fairqueue.Limits{Permits: 2, Lease: 10 * time.Second}
	// Flow a holds a permit all along at a small counter; flow b is
	// granted and released over and over at 4e8 a grant.
	hold := fairqueue.TicketArgs{ID: "n1:0:aaaa.0", Node: "n1", Limits: l, Cost: 0.25}
	_, err := s.Acquire(ctx, hold)
	require.NoError(t, err)
	var most float64
	for n := 1; n <= 10; n++ {
		b := fairqueue.TicketArgs{ID: "n1:" + strconv.Itoa(n) + ":bbbb.0", Node: "n1", Limits: l, Cost: 4e8}
		r, err := s.Acquire(ctx, b)
		require.NoError(t, err)
		require.True(t, r.Granted)
		most = max(most, vtime(t, rdb, s))
		require.NoError(t, s.Release(ctx, b))
	}
	assert.LessOrEqual(t, most, 1e9, "the virtual time stays below 10^9")
	a, err := rdb.HGet(ctx, s.Tag()+":fcount", "aaaa.0").Float64()
	require.NoError(t, err)
	idle, err := rdb.ZScore(ctx, s.Tag()+":fidle", "bbbb.0").Result()
	require.NoError(t, err)
	v := vtime(t, rdb, s)
	// b was charged 10 x 4e8 in all, a 0.25 once: the rebases kept the
	// difference, to the last bit, and b's counter stands 4e8 (its last
	// charge) above the virtual time (its last grant's start).
	assert.Equal(t, 4e9-0.25, idle-a, "b's use minus a's, exactly")
	assert.Equal(t, 4e8, idle-v, "b's counter above the virtual time, exactly")
}

// vtime reads the queue's virtual time (missing: 0).
func vtime(t *testing.T, rdb *redis.Client, s *redisstore.Store) float64 {
	t.Helper()
	v, err := rdb.Get(context.Background(), s.Tag()+":vtime").Float64()
	if errors.Is(err, redis.Nil) {
		return 0
	}
	require.NoError(t, err)
	return v
}

// While a reload turns fair queueing on or off, FIFO and fair tickets
// wait together: they are served by arrival, each kind in its order.
func TestFIFOAndFairTicketsTogetherAreServedByArrival(t *testing.T) {
	rdb, s := openStore(t, "mixed")
	ctx := context.Background()
	l := fairqueue.Limits{Permits: 1, Lease: 10 * time.Second}
	args := func(id string) fairqueue.TicketArgs {
		return fairqueue.TicketArgs{ID: id, Node: "n1", Limits: l, Cost: 1}
	}
	first := args("n1:1")
	_, err := s.Acquire(ctx, first)
	require.NoError(t, err)
	order := []string{"n1:2", "n1:3:aaaa.0", "n1:4", "n1:5:bbbb.0", "n1:6:aaaa.0", "n1:7"}
	for _, id := range order {
		r, err := s.Acquire(ctx, args(id))
		require.NoError(t, err)
		require.False(t, r.Granted, id)
	}
	assert.Len(t, readState(t, rdb, "mixed").Waiting, len(order))
	held := first
	var got []string
	for range order {
		require.NoError(t, s.Release(ctx, held))
		h := readState(t, rdb, "mixed").Holders
		require.Len(t, h, 1)
		got = append(got, h[0])
		held = args(h[0])
	}
	assert.Equal(t, order, got)
}

// The permits a tenant holds are recounted from the holders at each
// reconcile: a count that drifted above the truth (bookkeeping lost in a
// failover, an operator's edit) would keep a capped tenant waiting for
// releases that never come.
func TestReconcileRecountsATenantsPermitsFromTheHolders(t *testing.T) {
	rdb, s := openStore(t, "recount")
	ctx := context.Background()
	l := fairqueue.Limits{Permits: 2, Lease: 10 * time.Second, MaxInFlightPerTenant: 1}
	a1 := fairqueue.TicketArgs{ID: "n1:1:aaaa.0", Node: "n1", Limits: l, Cost: 1}
	a2 := fairqueue.TicketArgs{ID: "n1:2:aaaa.1", Node: "n1", Limits: l, Cost: 1}
	r, err := s.Acquire(ctx, a1)
	require.NoError(t, err)
	require.True(t, r.Granted)
	r, err = s.Acquire(ctx, a2)
	require.NoError(t, err)
	require.False(t, r.Granted, "the tenant is at its cap")
	require.NoError(t, rdb.HSet(ctx, s.Tag()+":finf", "aaaa", 3, "aaaa.0", 3).Err()) // the drift
	require.NoError(t, s.Release(ctx, a1))
	assert.Empty(t, readState(t, rdb, "recount").Holders, "counted as holding 2 more, the tenant waits")
	_, err = s.Reconcile(ctx, "n1", l)
	require.NoError(t, err)
	assert.Equal(t, []string{a2.ID}, readState(t, rdb, "recount").Holders, "recounted, it is served")
	inf, err := rdb.HGetAll(ctx, s.Tag()+":finf").Result()
	require.NoError(t, err)
	assert.Equal(t, map[string]string{"aaaa": "1", "aaaa.1": "1"}, inf)
}

// openStore starts a Redis and opens queue name on it as node "n1",
// for the tests that drive the scripts directly.
func openStore(t *testing.T, name string) (*redis.Client, *redisstore.Store) {
	t.Helper()
	rdb := redistest.Start(t).Client(t)
	s := redisstore.New(rdb, name, redisstore.Options{})
	require.NoError(t, s.Open(context.Background(), "n1", nopListener{}))
	t.Cleanup(func() { _ = s.Close() })
	return rdb, s
}

// Tenants served once each (a tenant from a value the client can vary)
// never let the virtual time move: the queue keeps at most
// fairqueue.IdleFlows of their idle counters, the furthest above it, as
// the local store does.
func TestNewTenantsServedOnceLeaveBoundedState(t *testing.T) {
	rdb, s := openStore(t, "idle")
	ctx := context.Background()
	l := fairqueue.Limits{Permits: 1, Lease: 10 * time.Second}
	heavy := fairqueue.TicketArgs{ID: "n1:0:heavy.0", Node: "n1", Limits: l, Cost: 5}
	_, err := s.Acquire(ctx, heavy)
	require.NoError(t, err)
	require.NoError(t, s.Release(ctx, heavy))
	tenants := fairqueue.IdleFlows + 500
	for i := range tenants {
		id := fmt.Sprintf("n1:%d:%016x.0", i+1, i)
		r, err := s.Acquire(ctx, fairqueue.TicketArgs{ID: id, Node: "n1", Limits: l, Cost: 1})
		require.NoError(t, err)
		require.True(t, r.Granted)
		require.NoError(t, s.Release(ctx, fairqueue.TicketArgs{ID: id, Node: "n1", Limits: l}))
	}
	n, err := rdb.ZCard(ctx, s.Tag()+":fidle").Result()
	require.NoError(t, err)
	assert.LessOrEqual(t, n, int64(fairqueue.IdleFlows), "idle counters kept after %d tenants served once each", tenants)
	_, err = rdb.ZScore(ctx, s.Tag()+":fidle", "heavy.0").Result()
	assert.NoError(t, err, "the counter furthest above the virtual time is kept")
}
