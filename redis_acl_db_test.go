package caddyfairqueue

import (
	"context"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/fairqueue/redisstore"
	"github.com/fair-queue/caddy-fair-queue/internal/redistest"
)

// A queue in a database other than 0 (redis db 1): its client SELECTs
// it on each connection, which ACLRules no longer grants; the ACL given
// for it (redisstore.DBRules, what the log's needs and store_refused
// say) adds SELECT, and a user granted exactly that queues there.
func TestAUserGrantedTheACLGivenForADatabaseQueuesThere(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	ctx := context.Background()
	srv := redistest.Start(t)
	args := []any{"ACL", "SETUSER", "fq", "on", ">fq-secret"}
	for _, r := range strings.Fields(redisstore.DBRules("", 1)) {
		args = append(args, r)
	}
	require.NoError(t, srv.Client(t).Do(ctx, args...).Err())
	h := provision(t, newContext(t), "", &Handler{Name: "db1", Permits: 1, OnStoreError: FailClosed,
		Redis: &RedisConfig{Addresses: []string{srv.Addr()}, Username: "fq", Password: "fq-secret", DB: 1}})
	handsOverThePermit(t, h)
	for _, e := range h.engineList() {
		require.True(t, e.q.Stats().StoreUp)
	}
	require.NoError(t, h.Cleanup())
}
