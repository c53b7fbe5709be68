package caddyfairqueue

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
	"github.com/fair-queue/caddy-fair-queue/fairqueue/redisstore"
	"github.com/fair-queue/caddy-fair-queue/internal/redistest"
)

// A Redis user granted exactly the ACL the queue gives
// (redisstore.ACLRules), on one server and on a Redis Cluster (each
// node), runs every kind of queue's whole life: the fast path, a waiter
// handed the permit over the sharded Pub/Sub channels, heartbeats,
// tenants, tokens, a pool, the local fallback's bookkeeping, leaving
// (no key left); status --redis and purge --dead, as a user granted
// the tools' (redisstore.ListRules: SCAN too, to list the queues), read
// and sweep the registry. Redis refuses them nothing (ACL LOG): not
// INFO either, which the store reads the server's version with HELLO in
// place of.
func TestAUserGrantedTheACLGivenRunsEveryKindOfQueue(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	ctx := context.Background()
	setUser := func(user, rules string) []any {
		args := []any{"ACL", "SETUSER", user, "on", ">fq-secret"}
		for _, r := range strings.Fields(rules) {
			args = append(args, r)
		}
		return args
	}
	args := setUser("fq", redisstore.ACLRules(""))
	handlers := func(rc func() *RedisConfig) []*Handler {
		return []*Handler{
			{Name: "plain", Permits: 1, OnStoreError: FailClosed, Redis: rc()},
			{Name: "tenants", Permits: 1, Tenant: "{http.request.header.T}", MaxQueuePerTenant: 5, MaxInFlightPerTenant: 1, OnStoreError: FailClosed, Redis: rc()},
			{Name: "tokens", Permits: 1, KVTokens: 100000, OnStoreError: FailClosed, Redis: rc()},
			{Name: "pool", Upstreams: []fairqueue.Upstream{{Dial: "127.0.0.1:1", Permits: 1}}, OnStoreError: FailClosed, Redis: rc()},
			{Name: "local", Permits: 1, OnStoreError: FailLocal, Redis: rc(), MaxWait: caddy.Duration(5 * time.Second)},
		}
	}
	t.Run("single", func(t *testing.T) {
		srv := redistest.Start(t)
		admin := srv.Client(t)
		require.NoError(t, admin.Do(ctx, args...).Err())
		require.NoError(t, admin.Do(ctx, setUser("fqcli", redisstore.ListRules("", 0))...).Err())
		for _, h := range handlers(func() *RedisConfig {
			return &RedisConfig{Addresses: []string{srv.Addr()}, Username: "fq", Password: "fq-secret"}
		}) {
			h := provision(t, newContext(t), "", h)
			handsOverThePermit(t, h)
			out, err := runCLI(t, "status", "--redis", "redis://fqcli:fq-secret@"+srv.Addr())
			assert.NoError(t, err, out)
			require.NoError(t, h.Cleanup())
		}
		out, err := runCLI(t, "purge", "--redis", "redis://fqcli:fq-secret@"+srv.Addr(), "--dead", "--dead-for", "1ms", "--yes")
		assert.NoError(t, err, out)
		assert.Empty(t, denials(t, admin.Do(ctx, "ACL", "LOG")), "denials")
		require.Eventually(t, func() bool { return len(srv.Keys(t, "*")) == 0 }, 10*time.Second, 20*time.Millisecond, "%v", srv.Keys(t, "*"))
	})
	t.Run("cluster", func(t *testing.T) {
		c := redistest.StartCluster(t, 3)
		for _, n := range c.Nodes() {
			require.NoError(t, n.Client(t).Do(ctx, args...).Err())
		}
		for _, h := range handlers(func() *RedisConfig {
			return &RedisConfig{Mode: ModeCluster, Addresses: c.Addrs(), Username: "fq", Password: "fq-secret"}
		}) {
			h := provision(t, newContext(t), "", h)
			handsOverThePermit(t, h)
			require.NoError(t, h.Cleanup())
		}
		for _, n := range c.Nodes() {
			assert.Empty(t, denials(t, n.Client(t).Do(ctx, "ACL", "LOG")), "denials on %s", n.Addr())
		}
		require.Eventually(t, func() bool { return len(c.Keys(t, "*")) == 0 }, 10*time.Second, 20*time.Millisecond, "%v", c.Keys(t, "*"))
	})
}

// denials are the entries of ACL LOG, every one (INFO's too).
func denials(t *testing.T, cmd *redis.Cmd) []string {
	v, err := cmd.Result()
	require.NoError(t, err)
	var out []string
	for _, e := range v.([]any) {
		out = append(out, fmt.Sprint(e))
	}
	return out
}
