package caddyfairqueue

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/fairqueue/redisstore"
	"github.com/fair-queue/caddy-fair-queue/internal/redistest"
)

// A user granted the ACL given (redisstore.ACLRules) and the key of a
// reject_stream (docs/reference.md: `~llm:rejects`), on the data
// servers of a Sentinel deployment, queues through the master the
// Sentinels name and records its rejects in the stream there: the
// failover client runs nothing more on the master than the single
// server's client does.
func TestAUserGrantedTheACLGivenQueuesAndRecordsRejectsThroughSentinel(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	ctx := context.Background()
	s := redistest.StartSentinel(t)
	args := []any{"ACL", "SETUSER", "fq", "on", ">fq-secret"}
	for _, r := range strings.Fields(redisstore.ACLRules("") + " ~app:rejects") {
		args = append(args, r)
	}
	for _, srv := range s.Servers() { // ACL is not replicated
		require.NoError(t, srv.Client(t).Do(ctx, args...).Err())
	}
	master := s.Servers()[0]
	h := provision(t, newContext(t), "", &Handler{Name: "sentinel-acl", Permits: 1, OnStoreError: FailClosed,
		MaxWait:      caddy.Duration(300 * time.Millisecond),
		RejectStream: &RejectStreamConfig{Key: "app:rejects"},
		Redis: &RedisConfig{Mode: ModeSentinel, MasterName: s.MasterName(), Addresses: s.SentinelAddrs(),
			Username: "fq", Password: "fq-secret"}})
	handsOverThePermit(t, h)

	next := newHolder()
	a := newRequest(context.Background(), `{}`).start(h, next)
	next.waitEntered(t)
	rejected := newRequest(context.Background(), `{}`).start(h, next).wait(t)
	assert.Equal(t, http.StatusTooManyRequests, rejected.w.Code)
	next.release <- struct{}{}
	a.wait(t)

	admin := master.Client(t)
	require.Eventually(t, func() bool {
		n, err := admin.XLen(ctx, "app:rejects").Result()
		return err == nil && n == 1
	}, 10*time.Second, 20*time.Millisecond, "the reject is recorded in the stream on the master")
	for _, e := range h.engineList() {
		assert.True(t, e.q.Stats().StoreUp)
	}
	require.NoError(t, h.Cleanup())
	assert.Empty(t, denials(t, admin.Do(ctx, "ACL", "LOG")), "denials on the master")
}
