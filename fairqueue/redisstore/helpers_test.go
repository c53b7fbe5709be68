package redisstore_test

import (
	"context"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
	"github.com/fair-queue/caddy-fair-queue/fairqueue/redisstore"
	"github.com/fair-queue/caddy-fair-queue/internal/faultproxy"
	"github.com/fair-queue/caddy-fair-queue/internal/redistest"
)

// node is one Queue with its own client and subscription, as one Caddy
// instance would have.
type node struct {
	q   *fairqueue.Queue
	rdb *redis.Client
}

// newNode opens queue name on srv as a new node. Its client has the
// short timeouts a production queue client has.
func newNode(t testing.TB, srv *redistest.Server, name string, cfg fairqueue.Config) *node {
	t.Helper()
	return wrappedNode(t, srv, name, cfg, func(s fairqueue.Store) fairqueue.Store { return s })
}

// wrappedNode is newNode with wrap between the Queue and its Redis store.
func wrappedNode(t testing.TB, srv *redistest.Server, name string, cfg fairqueue.Config, wrap func(fairqueue.Store) fairqueue.Store) *node {
	t.Helper()
	rdb := redis.NewClient(&redis.Options{
		Addr:                  srv.Addr(),
		DialTimeout:           redisstore.DefaultDialTimeout,
		ReadTimeout:           redisstore.DefaultReadTimeout,
		WriteTimeout:          redisstore.DefaultWriteTimeout,
		MaxRetries:            redisstore.DefaultMaxRetries,
		ContextTimeoutEnabled: true,
	})
	cfg.Name = name
	if cfg.Logger == nil && os.Getenv("FQ_DEBUG") != "" {
		cfg.Logger, _ = zap.NewDevelopment()
	}
	q, err := fairqueue.New(wrap(redisstore.New(rdb, name, redisstore.Options{})), cfg)
	require.NoError(t, err)
	n := &node{q: q, rdb: rdb}
	t.Cleanup(func() {
		_ = q.Close()
		_ = rdb.Close()
	})
	return n
}

// proxiedNode is newNode reaching srv through a fault proxy, which it
// returns: the test cuts and heals the node's link to Redis.
func proxiedNode(t testing.TB, srv *redistest.Server, name string, cfg fairqueue.Config) (*node, *faultproxy.Proxy) {
	t.Helper()
	return wrappedProxiedNode(t, srv, name, cfg, func(s fairqueue.Store) fairqueue.Store { return s })
}

// wrappedProxiedNode is proxiedNode with wrap between the Queue and its
// Redis store.
func wrappedProxiedNode(t testing.TB, srv *redistest.Server, name string, cfg fairqueue.Config, wrap func(fairqueue.Store) fairqueue.Store) (*node, *faultproxy.Proxy) {
	t.Helper()
	px := faultproxy.Start(t, srv.Addr())
	rdb := redis.NewClient(&redis.Options{
		Addr:                  px.Addr(),
		DialTimeout:           redisstore.DefaultDialTimeout,
		ReadTimeout:           redisstore.DefaultReadTimeout,
		WriteTimeout:          redisstore.DefaultWriteTimeout,
		MaxRetries:            redisstore.DefaultMaxRetries,
		ContextTimeoutEnabled: true,
	})
	cfg.Name = name
	q, err := fairqueue.New(wrap(redisstore.New(rdb, name, redisstore.Options{})), cfg)
	require.NoError(t, err)
	t.Cleanup(func() {
		_ = q.Close()
		_ = rdb.Close()
	})
	return &node{q: q, rdb: rdb}, px
}

// cutOffPair starts two nodes of queue name under cfg: a reaches srv
// through a fault proxy (px cuts and heals its link), b directly. Each
// node in warm has served one request of its own: it has joined.
func cutOffPair(t testing.TB, srv *redistest.Server, name string, cfg fairqueue.Config, warm ...fairqueue.Request) (a, b *node, px *faultproxy.Proxy) {
	t.Helper()
	a, px = proxiedNode(t, srv, name, cfg)
	b = newNode(t, srv, name, cfg)
	for i, n := range []*node{a, b}[:len(warm)] {
		p, err := n.q.Acquire(context.Background(), warm[i])
		require.NoError(t, err)
		p.Release()
	}
	return a, b, px
}

// eventually polls cond until it holds or d passes.
func eventually(t testing.TB, d time.Duration, cond func() bool, msg string, args ...any) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf(msg, args...)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// queueState reads a queue's Redis state directly.
type queueState struct {
	Waiting []string
	Holders []string
	Nodes   []string
}

func readState(t testing.TB, rdb *redis.Client, name string) queueState {
	t.Helper()
	ctx := context.Background()
	tag := redisstore.New(rdb, name, redisstore.Options{}).Tag()
	w, err := rdb.ZRange(ctx, tag+":waiting", 0, -1).Result()
	require.NoError(t, err)
	fw, err := rdb.HKeys(ctx, tag+":fticket").Result() // fair tickets waiting
	require.NoError(t, err)
	w = append(w, fw...)
	h, err := rdb.ZRange(ctx, tag+":holders", 0, -1).Result()
	require.NoError(t, err)
	n, err := rdb.ZRange(ctx, tag+":nodes", 0, -1).Result()
	require.NoError(t, err)
	return queueState{Waiting: w, Holders: h, Nodes: n}
}

// takeAtOnce acquires reqs on n all at once, each of which must be
// granted (msg says what a refusal means), then releases them.
func takeAtOnce(t *testing.T, n *node, msg string, reqs ...fairqueue.Request) {
	t.Helper()
	var wg sync.WaitGroup
	got := make(chan *fairqueue.Permit, len(reqs))
	for _, r := range reqs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			p, err := n.q.Acquire(context.Background(), r)
			if assert.NoError(t, err, msg) {
				got <- p
			}
		}()
	}
	wg.Wait()
	close(got)
	for p := range got {
		p.Release()
	}
}
