package caddyfairqueue

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/internal/redistest"
)

// A Redis user restricted the common way, every command but the
// @dangerous ones (INFO among them), on every key and channel, has all
// the queue needs: requests queue for the permits through Redis rather
// than meeting on_store_error (here fail_open: unlimited) for good.
func TestRedisUserWithoutDangerousCommandsQueues(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	srv := redistest.Start(t)
	require.NoError(t, srv.Client(t).Do(context.Background(),
		"ACL", "SETUSER", "fq", "on", ">fq-secret", "~*", "&*", "+@all", "-@dangerous").Err())
	h := provision(t, newContext(t), "", &Handler{Name: "acl", Permits: 1, Redis: &RedisConfig{
		Addresses: []string{srv.Addr()}, Username: "fq", Password: "fq-secret",
	}})
	handsOverThePermit(t, h)
	require.NotEmpty(t, srv.Keys(t, "{fair_queue:acl}:*"), "the queue lives in Redis")
}
