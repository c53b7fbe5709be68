package redisstore_test

import (
	"context"
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

// rollbackScene is a failover test's setting: nodes a and b (b nil for
// a test of one node) of queue name on srv, admin to snapshot and read
// Redis with, and ctx, ending at the queue's max wait.
type rollbackScene struct {
	srv   *redistest.Server
	name  string
	cfg   fairqueue.Config
	a, b  *node
	admin *redis.Client
	ctx   context.Context
}

// newScene starts a scene of two fresh nodes of queue name.
func newScene(t *testing.T, name string, cfg fairqueue.Config) *rollbackScene {
	t.Helper()
	srv := redistest.Start(t)
	return sceneOf(t, srv, name, cfg, newNode(t, srv, name, cfg), newNode(t, srv, name, cfg))
}

// oneNodeScene starts a scene of one fresh node, a, of queue name.
func oneNodeScene(t *testing.T, name string, cfg fairqueue.Config) *rollbackScene {
	t.Helper()
	srv := redistest.Start(t)
	return sceneOf(t, srv, name, cfg, newNode(t, srv, name, cfg), nil)
}

// warmScene starts a scene of two nodes, each joined (one request of a
// token served) and past its first heartbeat (warmPair).
func warmScene(t *testing.T, name string, cfg fairqueue.Config) *rollbackScene {
	t.Helper()
	srv := redistest.Start(t)
	a, b := warmPair(t, srv, name, cfg)
	return sceneOf(t, srv, name, cfg, a, b)
}

func sceneOf(t *testing.T, srv *redistest.Server, name string, cfg fairqueue.Config, a, b *node) *rollbackScene {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), cfg.MaxWait)
	t.Cleanup(cancel)
	return &rollbackScene{srv: srv, name: name, cfg: cfg, a: a, b: b, admin: srv.Client(t), ctx: ctx}
}

// fresh is a new context ending at the queue's max wait from now.
func (s *rollbackScene) fresh(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), s.cfg.MaxWait)
	t.Cleanup(cancel)
	return ctx
}

// state reads the queue's state in Redis.
func (s *rollbackScene) state(t *testing.T) queueState {
	t.Helper()
	return readState(t, s.admin, s.name)
}

// waiting waits until Redis counts n waiters, failing with msg.
func (s *rollbackScene) waiting(t *testing.T, n int, msg string) {
	t.Helper()
	eventually(t, 5*time.Second, func() bool { return len(s.state(t).Waiting) == n }, "%s", msg)
}

// holding waits until Redis counts n holders, failing with msg.
func (s *rollbackScene) holding(t *testing.T, n int, msg string) {
	t.Helper()
	eventually(t, 5*time.Second, func() bool { return len(s.state(t).Holders) == n }, "%s", msg)
}

// holdsOnly reports whether Redis counts ticket as the one holder.
func (s *rollbackScene) holdsOnly(t *testing.T, ticket string) func() bool {
	return func() bool {
		h := s.state(t).Holders
		return len(h) == 1 && h[0] == ticket
	}
}

// tokens reads the tokens Redis counts held.
func (s *rollbackScene) tokens(t *testing.T) int {
	t.Helper()
	return tsum(t, s.a, s.name)
}

// noTokens waits until Redis counts no tokens held.
func (s *rollbackScene) noTokens(t *testing.T) {
	t.Helper()
	eventually(t, 5*time.Second, func() bool { return s.tokens(t) == 0 }, "tokens left counted for ended requests")
}

// leave closes the scene's nodes and asserts Redis is left clean.
func (s *rollbackScene) leave(t *testing.T) {
	t.Helper()
	for _, n := range []*node{s.a, s.b} {
		if n != nil {
			require.NoError(t, n.q.Close())
		}
	}
	assert.Empty(t, s.srv.Keys(t, "*"), "keys left after every node left")
}

// waitFor returns the acquire's result, failing the test if it never
// returns (Acquire ends at its context's deadline).
func waitFor(t *testing.T, ch <-chan acquired, what string) acquired {
	t.Helper()
	select {
	case r := <-ch:
		return r
	case <-time.After(rollbackCfg.MaxWait + 5*time.Second):
		t.Fatalf("%s: the acquire never returned", what)
	}
	return acquired{}
}

// served waits for the acquire on ch, requires it granted (msgAndArgs
// the failure's message) and ends its request.
func served(t *testing.T, ch <-chan acquired, what string, msgAndArgs ...any) acquired {
	t.Helper()
	r := waitFor(t, ch, what)
	require.NoError(t, r.err, msgAndArgs...)
	r.p.Release()
	return r
}

// beaten waits for n's first heartbeat (it goes at the first turn of
// the node's loop after it joined): a write lost after it is not made
// good by that first heartbeat.
func beaten(t *testing.T, n *node) {
	t.Helper()
	eventually(t, 5*time.Second, func() bool { return !n.q.Stats().Cluster.At.IsZero() }, "no heartbeat")
}

// warmUp serves req on each of ns (each joins the queue) and waits for
// its first heartbeat.
func warmUp(t *testing.T, req fairqueue.Request, ns ...*node) {
	t.Helper()
	for _, n := range ns {
		p, err := n.q.Acquire(context.Background(), req)
		require.NoError(t, err)
		p.Release()
		beaten(t, n)
	}
}

// warmPair starts two nodes of queue name, each joined (one request
// served) and past its first heartbeat.
func warmPair(t *testing.T, srv *redistest.Server, name string, cfg fairqueue.Config) (a, b *node) {
	t.Helper()
	a, b = newNode(t, srv, name, cfg), newNode(t, srv, name, cfg)
	warmUp(t, fairqueue.Request{Tokens: 1}, a, b)
	return a, b
}

// stillWaiting asserts the acquire on ch has not returned: its request
// does not run beside those Redis counts.
func stillWaiting(t *testing.T, ch <-chan acquired, why string) {
	t.Helper()
	select {
	case r := <-ch:
		t.Fatalf("%s (err %v)", why, r.err)
	case <-time.After(200 * time.Millisecond):
	}
}

// acquireReq is acquireAsync for req.
func acquireReq(n *node, ctx context.Context, req fairqueue.Request) <-chan acquired {
	ch := make(chan acquired, 1)
	go func() {
		p, err := n.q.Acquire(ctx, req)
		ch <- acquired{p, err, time.Now()}
	}()
	return ch
}

// tsum reads the tokens Redis counts held in queue name.
func tsum(t *testing.T, n *node, name string) int {
	t.Helper()
	tag := redisstore.New(n.rdb, name, redisstore.Options{}).Tag()
	v, err := n.rdb.Get(context.Background(), tag+":tsum").Result()
	if err != nil {
		return 0
	}
	w, err := strconv.Atoi(v)
	require.NoError(t, err)
	return w
}

// uheld reads which upstream each holder of queue name runs on.
func uheld(t *testing.T, n *node, name string) map[string]string {
	t.Helper()
	tag := redisstore.New(n.rdb, name, redisstore.Options{}).Tag()
	m, err := n.rdb.HGetAll(context.Background(), tag+":uheld").Result()
	require.NoError(t, err)
	return m
}
