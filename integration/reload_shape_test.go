package integration

import (
	"context"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/internal/harness"
	"github.com/fair-queue/caddy-fair-queue/internal/mockllm"
	"github.com/fair-queue/caddy-fair-queue/internal/redistest"
)

// reloadShapeTokens and reloadShapeDelay shape each answer: long enough
// that the reload finds holders and waiters of the old config.
const (
	reloadShapeTokens = 5
	reloadShapeDelay  = 60 * time.Millisecond
)

// pooledSite is a queue named llm with a pool of a and b, one permit
// each, in store, and reverse_proxy taking the granted upstream.
func pooledSite(a, b *replica, store string) string {
	return fmt.Sprintf(`
	fair_queue {
		name llm
		max_wait 60s
		upstream %s 1
		upstream %s 1
		%s
	}
	reverse_proxy {
		dynamic fair_queue
		flush_interval -1
	}`, a.addr, b.addr, store)
}

// staticSite is a queue named llm of permits in store in front of a
// alone.
func staticSite(a *replica, permits int, store string) string {
	return proxySite(a.addr, fmt.Sprintf(`
	fair_queue {
		name llm
		permits %d
		max_wait 60s
		%s
	}`, permits, store))
}

// reloadUnderLoad sends clients streams to c, reloads it to after once
// at least waiting of them wait, sends later streams (the first
// applies the new settings to the shared queue), and checks that every
// stream is served in full; it returns how many were sent.
func reloadUnderLoad(t *testing.T, c *harness.Caddy, after string, clients, waiting, later int) int {
	t.Helper()
	client := newClient(t)
	var all collect
	for i := range clients {
		all.send(context.Background(), client, c.URL(), "c"+strconv.Itoa(i), Chat{Stream: true, Seq: "c" + strconv.Itoa(i)})
	}
	require.True(t, eventually(10*time.Second, func() bool {
		return localStats(t, c, "llm").Waiting >= waiting
	}), "clients not queued: %+v", localStats(t, c, "llm"))
	require.NoError(t, c.Load(after))
	for i := range later {
		all.sendAcrossSwap(context.Background(), client, c.URL(), "n"+strconv.Itoa(i), Chat{Stream: true, Seq: "n" + strconv.Itoa(i)})
	}
	results := all.wait(t, 2*time.Minute)
	require.Len(t, results, clients+later)
	for name, r := range results {
		requireFullStream(t, r, reloadShapeTokens, "client %s", name)
	}
	return clients + later
}

// reloadShape runs clients streams under before, reloads to after while
// most wait, sends later streams under after (its first request applies
// its settings to the shared queue), and checks that every stream is
// served in full and each replica ran at most its permits under either
// config (maxA, maxB).
func reloadShape(t *testing.T, before, after func(a, b *replica, store string) string, maxA, maxB int) {
	for _, redis := range []bool{false, true} {
		t.Run(map[bool]string{false: "local store", true: "redis store"}[redis], func(t *testing.T) {
			t.Parallel() // its own Caddy, replicas and Redis
			store := ""
			if redis {
				rds := redistest.Start(t)
				store = fmt.Sprintf("redis {\n\t\t\turl redis://%s/0\n\t\t}", rds.Addr())
			}
			cfg := mockllm.Config{Tokens: reloadShapeTokens, Delay: reloadShapeDelay}
			a, b := startReplica(t, cfg), startReplica(t, cfg)
			c := harness.StartCaddy(t, "caddy", before(a, b, store), harness.CaddyOptions{GracePeriod: 30 * time.Second})
			sent := reloadUnderLoad(t, c, after(a, b, store), 12, 8, 4)
			assert.LessOrEqual(t, a.mock.MaxInFlight(), maxA, "replica A at once")
			assert.LessOrEqual(t, b.mock.MaxInFlight(), maxB, "replica B at once")
			assert.Equal(t, sent, a.mock.Served()+b.mock.Served())
		})
	}
}

// A reload that removes a queue's pool: the waiters of the pool's config
// are granted permits that name no upstream, which their route
// (reverse_proxy with dynamic fair_queue) cannot send anywhere. They are
// served by the route of the config in force; A runs at most the new
// config's 2, B at most its pool permit.
func TestReloadThatRemovesAPoolServesItsWaiters(t *testing.T) {
	reloadShape(t, pooledSite, func(a, _ *replica, store string) string { return staticSite(a, 2, store) }, 2, 1)
}

// A reload that gives a queue a pool of A and B, one permit each, while
// the old config's streams run on A (its static upstream) and more wait:
// a waiter granted B is served on B, not on the old route's A, and the
// old config's holder on A keeps both upstreams from a second request
// until it ends.
func TestReloadThatAddsAPoolNeverRunsAnUpstreamAboveItsPermits(t *testing.T) {
	reloadShape(t, func(a, _ *replica, store string) string { return staticSite(a, 1, store) }, pooledSite, 1, 1)
}

// A reload that moves a queue to another store (the local store to
// Redis, or another key prefix): the old config's requests still run and
// wait in the old store, the new config's in the new one, and the
// upstream never runs more than the permits (1) of either.
func TestReloadThatSwitchesTheStoreNeverDoublesThePermits(t *testing.T) {
	for _, tc := range []struct {
		name   string
		before func(addr string) string
		after  func(addr string) string
	}{
		{"local to redis", func(string) string { return "" }, func(addr string) string {
			return fmt.Sprintf("redis {\n\t\t\turl redis://%s/0\n\t\t}", addr)
		}},
		{"another key prefix", func(addr string) string {
			return fmt.Sprintf("redis {\n\t\t\turl redis://%s/0\n\t\t}", addr)
		}, func(addr string) string {
			return fmt.Sprintf("redis {\n\t\t\turl redis://%s/0\n\t\t\tkey_prefix other\n\t\t}", addr)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			rds := redistest.Start(t)
			cfg := mockllm.Config{Tokens: reloadShapeTokens, Delay: reloadShapeDelay}
			a := startReplica(t, cfg)
			c := harness.StartCaddy(t, "caddy", staticSite(a, 1, tc.before(rds.Addr())), harness.CaddyOptions{GracePeriod: 30 * time.Second})
			sent := reloadUnderLoad(t, c, staticSite(a, 1, tc.after(rds.Addr())), 8, 6, 4)
			assert.Equal(t, 1, a.mock.MaxInFlight(), "requests at the upstream at once")
			assert.Equal(t, sent, a.mock.Served())
		})
	}
}
