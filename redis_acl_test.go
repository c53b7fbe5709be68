package caddyfairqueue

import (
	"context"
	"net/http"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/fairqueue/redisstore"
	"github.com/fair-queue/caddy-fair-queue/internal/redistest"
)

// A Redis user restricted the common way, every command but the
// @dangerous ones (INFO among them), on every key and channel, has all
// the queue needs: requests queue for the permits through Redis rather
// than meeting on_store_error (here fail_open: unlimited) for good,
// whichever protocol the client speaks.
func TestRedisUserWithoutDangerousCommandsQueues(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	srv := redistest.Start(t)
	require.NoError(t, srv.Client(t).Do(context.Background(),
		"ACL", "SETUSER", "fq", "on", ">fq-secret", "~*", "&*", "+@all", "-@dangerous").Err())
	for name, cfg := range map[string]*RedisConfig{
		"acl":  {Addresses: []string{srv.Addr()}, Username: "fq", Password: "fq-secret"},
		"acl3": {URL: "redis://fq:fq-secret@" + srv.Addr() + "/0?protocol=3"}, // RESP3 replies
	} {
		h := provision(t, newContext(t), "", &Handler{Name: name, Permits: 1, Redis: cfg})
		handsOverThePermit(t, h)
		require.NotEmpty(t, srv.Keys(t, "{fair_queue:"+name+"}:*"), "the queue lives in Redis")
	}
}

// The least a Redis user needs, as docs/reference.md gives it (its `ACL
// SETUSER fq on >secret ...`): the queue's keys, the registry's, its
// channels, the commands it runs. The queue is named in the registry
// while open, and leaves nothing.
func TestRedisUserWithTheDocumentedRightsQueuesAndLeavesNothing(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	srv := redistest.Start(t)
	doc, err := os.ReadFile("docs/reference.md")
	require.NoError(t, err)
	m := regexp.MustCompile("`ACL SETUSER fq on >secret ([^`]+)`").FindSubmatch(doc)
	require.NotNil(t, m, "docs/reference.md gives the ACL")
	args := []any{"ACL", "SETUSER", "fq", "on", ">fq-secret"}
	for _, r := range strings.Fields(string(m[1])) {
		args = append(args, r)
	}
	require.NoError(t, srv.Client(t).Do(context.Background(), args...).Err())
	h := provision(t, newContext(t), "", &Handler{Name: "least", Permits: 1,
		Redis: &RedisConfig{Addresses: []string{srv.Addr()}, Username: "fq", Password: "fq-secret"}})
	handsOverThePermit(t, h)
	require.NotEmpty(t, srv.Keys(t, "{fair_queue:least}:*"), "the queue lives in Redis")
	names, err := srv.Client(t).ZRange(context.Background(), redisstore.RegistryKey(""), 0, -1).Result()
	require.NoError(t, err)
	require.Equal(t, []string{"least"}, names, "the registry of queues")
	require.NoError(t, h.Cleanup()) // the config is unloaded
	require.Eventually(t, func() bool { return len(srv.Keys(t, "*")) == 0 }, 10*time.Second, 20*time.Millisecond,
		"keys left after the config was unloaded: %v", srv.Keys(t, "*"))
}

// docs/reference.md (redis): a Redis user without the queue's channels
// (Redis 7's default acl-pubsub-default resetchannels) cannot queue: the
// first request meets on_store_error (here fail_closed: 503
// store_unavailable), before its max_wait, and so do the next ones.
func TestRedisUserWithoutTheChannelsMeetsOnStoreError(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	srv := redistest.Start(t)
	require.NoError(t, srv.Client(t).Do(context.Background(), "ACL", "SETUSER", "fq", "on", ">fq-secret",
		"resetkeys", "resetchannels", "~{fair_queue:*", "~{fair_queue}:*", "+@all", "-@dangerous").Err())
	const maxWait = 20 * time.Second
	h := provision(t, newContext(t), "", &Handler{Name: "nochannels", Permits: 1, OnStoreError: FailClosed,
		MaxWait: caddy.Duration(maxWait),
		Redis:   &RedisConfig{Addresses: []string{srv.Addr()}, Username: "fq", Password: "fq-secret"}})
	for i := range 2 {
		start := time.Now()
		req := newRequest(context.Background(), `{}`).start(h, okHandler)
		took := req.waitFor(t, start, 2*maxWait)
		t.Logf("request %d: %d %q after %v", i, req.w.Code, req.w.Header().Get("Fair-Queue-Reason"), took)
		assert.Less(t, took, maxWait, "answered at or past its max_wait")
		assert.Equal(t, http.StatusServiceUnavailable, req.w.Code, "request %d", i)
		assert.Equal(t, "store_unavailable", req.w.Header().Get("Fair-Queue-Reason"), "request %d", i)
	}
}
