package redisstore_test

import (
	"context"
	"errors"
	"regexp"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
	"github.com/fair-queue/caddy-fair-queue/fairqueue/redisstore"
	"github.com/fair-queue/caddy-fair-queue/internal/faultproxy"
	"github.com/fair-queue/caddy-fair-queue/internal/redistest"
)

// evalshaCalls returns how many EVALSHA srv has run.
func evalshaCalls(t *testing.T, rdb *redis.Client) int {
	t.Helper()
	info, err := rdb.Info(context.Background(), "commandstats").Result()
	require.NoError(t, err)
	m := regexp.MustCompile(`cmdstat_evalsha:calls=(\d+)`).FindStringSubmatch(info)
	if m == nil {
		return 0
	}
	n, err := strconv.Atoi(m[1])
	require.NoError(t, err)
	return n
}

// lostRegisterStore opens queue "q" as node "a" through px, with a
// client that ends its calls at their context's end (as Caddy's does),
// and runs a heartbeat whose register px holds: the heartbeat's context
// ends first, the register's answer is lost, and the register reaches
// Redis once release is called.
func lostRegisterStore(t *testing.T, srv *redistest.Server, l fairqueue.Limits) (s *redisstore.Store, release func()) {
	t.Helper()
	px := faultproxy.Start(t, srv.Addr())
	rdb := redis.NewClient(&redis.Options{
		Addr: px.Addr(), DialTimeout: 5 * time.Second, ReadTimeout: 10 * time.Second,
		WriteTimeout: 5 * time.Second, ContextTimeoutEnabled: true,
	})
	t.Cleanup(func() { _ = rdb.Close() })
	s = redisstore.New(rdb, "q", redisstore.Options{})
	require.NoError(t, s.Open(context.Background(), "a", nopListener{}))
	t.Cleanup(func() { _ = s.Close() })

	held, release := px.HoldNext([]byte(redisstore.RegistryKey("")))
	t.Cleanup(release)
	// A heartbeat that saw no epoch yet names the queue again (a changed
	// data set may have lost the name).
	hctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err := s.Heartbeat(hctx, fairqueue.HeartbeatArgs{Node: "a", Limits: l, Beat: 1})
	require.NoError(t, err)
	select {
	case <-held:
	case <-time.After(10 * time.Second):
		t.Fatal("the heartbeat did not name the queue")
	}
	return s, release
}

// releaseRegisterAfterLastLeave lets a held register reach Redis once the
// last leave ran, and checks that it left no name in the registry and
// nothing for good.
func releaseRegisterAfterLastLeave(t *testing.T, srv *redistest.Server, direct *redis.Client, release func()) {
	t.Helper()
	ctx := context.Background()
	_, err := direct.ZScore(ctx, redisstore.RegistryKey(""), "q").Result()
	require.ErrorIs(t, err, redis.Nil, "the name after the last leave")
	before := evalshaCalls(t, direct)
	release()
	eventually(t, 10*time.Second, func() bool { return evalshaCalls(t, direct) > before },
		"the held register did not run")
	score, err := direct.ZScore(ctx, redisstore.RegistryKey(""), "q").Result()
	if !errors.Is(err, redis.Nil) {
		require.NoError(t, err)
		t.Fatalf("the registry names the queue given back (score %v): %v", score, srv.Keys(t, "*"))
	}
	for _, k := range srv.Keys(t, "*") {
		ttl, err := direct.PTTL(ctx, k).Result()
		require.NoError(t, err)
		assert.Positive(t, ttl, "key %s stays for good after the last leave", k)
	}
}

// Caddy's client ends a call at its context's end: a heartbeat's
// register that Redis does not answer in time (a loaded Redis, a slow
// link) fails on the instance's side, its answer lost, and Redis may run
// it late. Here it runs only after the instance's leave, the last, which
// deleted the queue's keys and took the name out of the registry. The
// name must not come back for good: nothing of a given-back queue stays
// (what a late call leaves expires by itself). (Failed before the fix:
// the late register put the name back, for the dead-queue sweep to find
// 10 minutes later, "the registry names the queue given back".)
func TestARegisterWhoseAnswerWasLostLeavesNoNameAfterTheLastLeave(t *testing.T) {
	ctx := context.Background()
	srv := redistest.Start(t)
	direct := srv.Client(t)
	l := fairqueue.Limits{Permits: 1, Lease: 20 * time.Second}
	s, release := lostRegisterStore(t, srv, l)

	require.NoError(t, s.Leave(ctx, "a", l))
	releaseRegisterAfterLastLeave(t, srv, direct, release)
}

// As above, but the instance whose register was lost leaves first: the
// last leave, another instance's, knows nothing of that register, which
// reaches Redis after it. (Failed before the fix as the test above.)
func TestARegisterLostByAnInstanceThatLeftBeforeTheLastLeavesNoName(t *testing.T) {
	ctx := context.Background()
	srv := redistest.Start(t)
	direct := srv.Client(t)
	l := fairqueue.Limits{Permits: 1, Lease: 20 * time.Second}
	a, release := lostRegisterStore(t, srv, l)
	b := redisstore.New(srv.Client(t), "q", redisstore.Options{})
	require.NoError(t, b.Open(ctx, "b", nopListener{}))
	t.Cleanup(func() { _ = b.Close() })
	_, err := b.Heartbeat(ctx, fairqueue.HeartbeatArgs{Node: "b", Limits: l, Beat: 1})
	require.NoError(t, err)

	require.NoError(t, a.Leave(ctx, "a", l))
	require.NoError(t, b.Leave(ctx, "b", l))
	releaseRegisterAfterLastLeave(t, srv, direct, release)
}
