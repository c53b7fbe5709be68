package caddyfairqueue

import (
	"context"
	"encoding/json"
	"net/http"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/internal/redistest"
)

// One queue on two Redis clients (two engines of one queue, see
// TestOneQueueOnTwoRedisClientsIsReportedOnce) is one row of the admin
// API, whose stats.in_flight counts the requests of both engines: its
// kv.node_tokens_held, "what this instance's running requests hold",
// counts the tokens of both too.
func TestAdminAPINodeTokensHeldCountsEveryEngineOfTheQueue(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	rds := redistest.Start(t)
	ctx := newContext(t)
	const name = "dup-clients-tokens"
	a := provision(t, ctx, "", &Handler{Name: name, Permits: 4, KVTokens: 100000, MaxWait: caddy.Duration(time.Minute),
		Redis: &RedisConfig{Addresses: []string{rds.Addr()}}})
	b := provision(t, ctx, "", &Handler{Name: name, Permits: 4, KVTokens: 100000, MaxWait: caddy.Duration(time.Minute),
		Redis: &RedisConfig{Addresses: []string{rds.Addr()}, DialTimeout: caddy.Duration(time.Second)}})
	next := newHolder()
	ra := newRequest(context.Background(), `{"model":"m","max_tokens":100}`).start(a, next)
	next.waitEntered(t)
	rb := newRequest(context.Background(), `{"model":"m","max_tokens":100}`).start(b, next)
	next.waitEntered(t)
	t.Cleanup(func() {
		next.release <- struct{}{}
		next.release <- struct{}{}
		ra.wait(t)
		rb.wait(t)
	})

	rec, err := getStatus(t, http.MethodGet, "/fair_queue/")
	require.NoError(t, err)
	var rep statusReport
	require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &rep))
	require.Len(t, rep.Queues, 1, rec.Body.String())
	q := rep.Queues[0]
	require.NotNil(t, q.Snapshot, q.Error)
	require.NotNil(t, q.KV)
	assert.Equal(t, 2, q.Stats.InFlight, "both requests run on this instance")
	require.Positive(t, q.KV.TokensHeld)
	assert.Equal(t, int64(q.KV.TokensHeld), q.KV.NodeTokensHeld,
		"this instance's two requests hold every token of the queue: %s", rec.Body.String())
}
