package caddyfairqueue

import (
	"context"
	"testing"
	"time"

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

// The least a Redis user needs, as docs/reference.md gives it: the
// queue's keys, the registry's, its channels, +@all -@dangerous. The
// queue is named in the registry while open, and leaves nothing.
func TestRedisUserWithTheDocumentedRightsQueuesAndLeavesNothing(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	srv := redistest.Start(t)
	require.NoError(t, srv.Client(t).Do(context.Background(), "ACL", "SETUSER", "fq", "on", ">fq-secret",
		"resetkeys", "resetchannels", "~{fair_queue:*", "~{fair_queue}:*", "&{fair_queue:*", "+@all", "-@dangerous").Err())
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
