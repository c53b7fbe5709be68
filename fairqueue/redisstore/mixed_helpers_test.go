package redisstore_test

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
	"github.com/fair-queue/caddy-fair-queue/fairqueue/redisstore"
)

// The tests of a rolling change drive one queue's scripts as two nodes
// with different limits (openStore): one with a setting, one without.

// tokensCounted is the limits of node w of a rolling change of
// kv_tokens: 100 tokens, permits to spare.
var tokensCounted = fairqueue.Limits{Permits: 10, Tokens: 100, Lease: 10 * time.Second}

// noTokens is the limits of a node that counts no tokens.
func noTokens(permits int) fairqueue.Limits {
	return fairqueue.Limits{Permits: permits, Lease: 10 * time.Second}
}

// acquireGranted acquires a on s and requires it granted.
func acquireGranted(t *testing.T, s *redisstore.Store, a fairqueue.TicketArgs) fairqueue.AcquireResult {
	t.Helper()
	r, err := s.Acquire(context.Background(), a)
	require.NoError(t, err)
	require.True(t, r.Granted)
	return r
}

// thirtyThenEighty has node n, counting tokens, run n:1 of 30 tokens and
// queue n:2 of 80 behind it. It returns both and the data set's epoch.
func thirtyThenEighty(t *testing.T, s *redisstore.Store) (n1, n2 fairqueue.TicketArgs, epoch string) {
	t.Helper()
	n1 = fairqueue.TicketArgs{ID: "n:1", Node: "n", Limits: tokensCounted, Cost: 1, Tokens: 30}
	n2 = fairqueue.TicketArgs{ID: "n:2", Node: "n", Limits: tokensCounted, Cost: 1, Tokens: 80}
	r := acquireGranted(t, s, n1)
	w, err := s.Acquire(context.Background(), n2)
	require.NoError(t, err)
	require.False(t, w.Granted, "30 + 80 tokens do not fit 100")
	require.Equal(t, r.Epoch, w.Epoch, "one data set")
	return n1, n2, r.Epoch
}

// eightyKeptOut asserts node w's request of 80 tokens waits while
// holder's of 80 runs, and withdraws it.
func eightyKeptOut(t *testing.T, s *redisstore.Store, holder string) {
	t.Helper()
	ctx := context.Background()
	w1 := fairqueue.TicketArgs{ID: "w:1", Node: "w", Limits: tokensCounted, Cost: 1, Tokens: 80}
	r, err := s.Acquire(ctx, w1)
	require.NoError(t, err)
	assert.False(t, r.Granted, "w granted 80 tokens beside %s's 80 under a capacity of 100", holder)
	require.NoError(t, s.Cancel(ctx, w1))
}

// bothLeave has nodes w (tokensCounted) and n (nLimits) leave, and
// asserts the queue's keys are gone.
func bothLeave(t *testing.T, rdb *redis.Client, s *redisstore.Store, nLimits fairqueue.Limits) {
	t.Helper()
	ctx := context.Background()
	require.NoError(t, s.Leave(ctx, "w", tokensCounted))
	require.NoError(t, s.Leave(ctx, "n", nLimits))
	assert.Empty(t, rdb.Keys(ctx, s.Tag()+"*").Val())
}

// poolMix is a rolling change that adds a pool: node n1 has it (two
// upstreams of one permit each), node n2 not (2 permits, its static
// upstream, which may be a or b).
type poolMix struct {
	rdb         *redis.Client
	s           *redisstore.Store
	name        string
	pool, plain fairqueue.Limits
}

func newPoolMix(t *testing.T, name string) *poolMix {
	t.Helper()
	rdb, s := openStore(t, name)
	return &poolMix{rdb: rdb, s: s, name: name,
		pool: fairqueue.Limits{Permits: 2, Lease: 10 * time.Second,
			Upstreams: []fairqueue.Upstream{{Dial: "a:1", Permits: 1}, {Dial: "b:1", Permits: 1}}},
		plain: fairqueue.Limits{Permits: 2, Lease: 10 * time.Second}}
}

func (m *poolMix) n1(id string) fairqueue.TicketArgs {
	return fairqueue.TicketArgs{ID: "n1:" + id, Node: "n1", Limits: m.pool, Cost: 1}
}

func (m *poolMix) n2(id string) fairqueue.TicketArgs {
	return fairqueue.TicketArgs{ID: "n2:" + id, Node: "n2", Limits: m.plain, Cost: 1}
}

func (m *poolMix) acquire(t *testing.T, a fairqueue.TicketArgs) fairqueue.AcquireResult {
	t.Helper()
	r, err := m.s.Acquire(context.Background(), a)
	require.NoError(t, err)
	return r
}

// fillBoth has n1 run n1:1 on a and n1:2 on b, and n2's first request
// wait behind them.
func (m *poolMix) fillBoth(t *testing.T) {
	t.Helper()
	r := m.acquire(t, m.n1("1"))
	require.Equal(t, "a:1", r.Upstream)
	r = m.acquire(t, m.n1("2"))
	require.Equal(t, "b:1", r.Upstream)
	r = m.acquire(t, m.n2("1"))
	require.False(t, r.Granted, "n2's first request waits: 2 permits held")
}

// handOnToN2 ends n1:1 and n1:2; the second release grants n2's
// waiter, which needs room on every upstream (it may run on any).
func (m *poolMix) handOnToN2(t *testing.T) {
	t.Helper()
	ctx := context.Background()
	require.NoError(t, m.s.Release(ctx, m.n1("1")))
	require.NoError(t, m.s.Release(ctx, m.n1("2")))
	require.ElementsMatch(t, []string{"n2:1"}, readState(t, m.rdb, m.name).Holders, "n2's waiter granted")
}

// n1GrantsNothingBeside asserts n1 grants no request while n2:1 runs (it
// may run on a or on b); then every request ends, both nodes leave,
// and the queue's keys are gone.
func (m *poolMix) n1GrantsNothingBeside(t *testing.T) {
	t.Helper()
	ctx := context.Background()
	r := m.acquire(t, m.n1("3"))
	assert.False(t, r.Granted, "n1 granted %q beside n2's request that may run there: 2 requests on an upstream of 1 permit", r.Upstream)
	if r.Granted {
		require.NoError(t, m.s.Release(ctx, m.n1("3")))
	} else {
		require.NoError(t, m.s.Cancel(ctx, m.n1("3")))
	}
	require.NoError(t, m.s.Release(ctx, m.n2("1")))
	require.NoError(t, m.s.Leave(ctx, "n1", m.pool))
	require.NoError(t, m.s.Leave(ctx, "n2", m.plain))
	assert.Empty(t, m.rdb.Keys(ctx, m.s.Tag()+"*").Val())
}
