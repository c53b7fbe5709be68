package caddyfairqueue

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"
)

func TestFirstRequestAnsweredStoreUnavailableMarksTheStoreDown(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	const name = "outage-first"
	ctx := newContext(t)
	h := provision(t, ctx, deadAddr(t), &Handler{Name: name, Permits: 1, OnStoreError: FailClosed})

	req := newRequest(context.Background(), `{}`).start(h, okHandler).wait(t)
	require.Equal(t, http.StatusServiceUnavailable, req.w.Code)
	require.Equal(t, "store_unavailable", req.w.Header().Get("Fair-Queue-Reason"))

	up, ok := gauge(t, ctx.GetMetricsRegistry(), "caddy_fair_queue_store_up", name)
	require.True(t, ok, "store_up{queue=%q} reported", name)
	assert.Equal(t, 0.0, up, "a request answered store_unavailable means the store reads down, from the first")
	for _, e := range h.engineList() {
		assert.False(t, e.q.Stats().StoreUp, "the admin API agrees")
	}
}

func TestRedisClientLogsGoThroughCaddysLoggerAndDialOncePerAttempt(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	_, orig, buffered := caddy.BufferedLog()
	flushed := false
	t.Cleanup(func() {
		if !flushed {
			caddy.UnbufferDefaultLogger(orig)
		}
	})

	h := provision(t, newContext(t), deadAddr(t), &Handler{Name: "outage-logs", Permits: 1, OnStoreError: FailClosed})
	req := newRequest(context.Background(), `{}`).start(h, okHandler).wait(t)
	require.Equal(t, "store_unavailable", req.w.Header().Get("Fair-Queue-Reason"))

	core, logs := observer.New(zapcore.DebugLevel)
	buffered.FlushTo(zap.New(core))
	caddy.UnbufferDefaultLogger(orig)
	flushed = true

	dials := logs.FilterMessageSnippet("failed to dial").All()
	require.NotEmpty(t, dials, "go-redis's lines reach Caddy's default logger (not stderr)")
	for _, e := range dials { // (Caddy's log buffer keeps no logger names)
		assert.GreaterOrEqual(t, e.Level, zapcore.WarnLevel)
		assert.False(t, strings.HasPrefix(e.Message, "redis: "), "the logger names the source; the message does not repeat it")
		assert.Contains(t, e.Message, "after 1 attempts",
			"each connection attempt dials once, bounded by dial_timeout (go-redis's default dials 5 times, 100ms apart)")
	}
	assert.LessOrEqual(t, len(dials), 1+redisMaxRetries(t), "one dial per try of the call: the first and its retries")
}

// redisMaxRetries is the retries a command of the handlers' Redis client
// makes.
func redisMaxRetries(t *testing.T) int {
	t.Helper()
	b, err := newRedisBackend(&RedisConfig{}, caddy.NewReplacer())
	require.NoError(t, err)
	return b.opts.MaxRetries
}

func TestRedisLogLineThatRepeatsIsLoggedOncePerIntervalWithItsRepeats(t *testing.T) {
	_, orig, buffered := caddy.BufferedLog()
	flushed := false
	t.Cleanup(func() {
		if !flushed {
			caddy.UnbufferDefaultLogger(orig)
		}
	})
	now := time.Unix(1000, 0)
	l := newRedisLogger(func() time.Time { return now })
	const dial = "redis: connection pool: failed to dial after %d attempts: %v"
	for range 5 {
		l.Printf(context.Background(), dial, 1, "connection refused")
	}
	l.Printf(context.Background(), "redis: discarding bad PubSub connection: %v", "EOF") // another line
	now = now.Add(redisLogEvery)
	l.Printf(context.Background(), dial, 1, "connection refused")

	core, logs := observer.New(zapcore.DebugLevel)
	buffered.FlushTo(zap.New(core))
	caddy.UnbufferDefaultLogger(orig)
	flushed = true
	var got []string
	for _, e := range logs.All() {
		got = append(got, fmt.Sprintf("%s %v", e.Message, e.ContextMap()["repeated"]))
	}
	assert.Equal(t, []string{
		"connection pool: failed to dial after 1 attempts: connection refused <nil>",
		"discarding bad PubSub connection: EOF <nil>",
		"connection pool: failed to dial after 1 attempts: connection refused 4",
	}, got)
}
