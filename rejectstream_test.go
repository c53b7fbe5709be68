package caddyfairqueue

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
	"github.com/fair-queue/caddy-fair-queue/internal/redistest"
)

func TestRejectStreamRecordsATimeoutRejectWithTheConfiguredFields(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	rds := redistest.Start(t)
	h := provision(t, newContext(t), rds.Addr(), &Handler{Permits: 1, MaxWait: caddy.Duration(300 * time.Millisecond),
		RejectStream: &RejectStreamConfig{Key: "app:busy", Fields: map[string]string{
			"conversation": "{http.request.header.X-Conversation-Id}",
			"model":        "{http.fair_queue.model}",
			"retry_after":  "{http.fair_queue.retry_after}",
			"unknown":      "{http.request.header.X-Absent}",
		}}})
	next := newHolder()
	a := newRequest(context.Background(), ``).start(h, next)
	next.waitEntered(t)
	defer func() { close(next.release); a.wait(t) }()

	start := time.Now()
	rejected := newRequest(context.Background(), `{"model":"m"}`, "X-Conversation-Id", "c-42").start(h, next).wait(t)
	require.Equal(t, http.StatusTooManyRequests, rejected.w.Code)
	assert.Less(t, time.Since(start), 2*time.Second)

	rdb := rds.Client(t)
	var entries []redis.XMessage
	require.Eventually(t, func() bool {
		var err error
		entries, err = rdb.XRange(context.Background(), "app:busy", "-", "+").Result()
		return err == nil && len(entries) > 0
	}, 5*time.Second, 10*time.Millisecond, "no entry in the stream")
	require.Len(t, entries, 1, "one reject, one entry")
	got := entries[0].Values
	at, err := time.Parse(time.RFC3339Nano, got["time"].(string))
	require.NoError(t, err)
	assert.WithinDuration(t, time.Now(), at, 5*time.Second)
	assert.GreaterOrEqual(t, mustAtoi(t, got["wait_ms"].(string)), 250)
	delete(got, "time")
	delete(got, "wait_ms")
	assert.Equal(t, map[string]any{
		"reason":       "timeout",
		"queue":        "default",
		"position":     "1",
		"conversation": "c-42",
		"model":        "m",
		"retry_after":  rejected.w.Header().Get("Retry-After"),
		"unknown":      "",
	}, got)
}

// newTestRejectStream is a reject stream on the Redis at addr, closed
// (and its worker waited for) when the test ends.
func newTestRejectStream(t *testing.T, addr string, cfg *RejectStreamConfig, log *zap.Logger) *rejectStream {
	t.Helper()
	rb, err := newRedisBackend(&RedisConfig{Addresses: []string{addr}}, caddy.NewReplacer())
	require.NoError(t, err)
	s, err := newRejectStream(cfg, rb, log)
	require.NoError(t, err)
	t.Cleanup(func() { s.close(); <-s.done })
	return s
}

func TestRejectStreamKeepsAboutMaxLenEntries(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	// Nodes of 10 entries, so that MAXLEN ~ trims at a small length.
	rds := redistest.Start(t, redistest.WithArgs("--stream-node-max-entries", "10"))
	s := newTestRejectStream(t, rds.Addr(), &RejectStreamConfig{Key: "busy", MaxLen: 20}, zap.NewNop())
	rej := &fairqueue.RejectError{Reason: fairqueue.ReasonQueueFull}
	for range 200 {
		s.add(caddy.NewReplacer(), "q", rej)
	}
	s.close()
	<-s.done
	n, err := rds.Client(t).XLen(context.Background(), "busy").Result()
	require.NoError(t, err)
	assert.GreaterOrEqual(t, n, int64(20))
	assert.LessOrEqual(t, n, int64(30), "trimmed to maxlen, give or take a node")
}

func TestRejectStreamNeverWaitsForRedisAndWarnsRateLimited(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	core, logs := observer.New(zap.WarnLevel)
	s := newTestRejectStream(t, deadAddr(t), &RejectStreamConfig{Key: "busy"}, zap.New(core))
	rej := &fairqueue.RejectError{Reason: fairqueue.ReasonTimeout}
	for range 5 {
		start := time.Now()
		s.add(caddy.NewReplacer(), "q", rej)
		assert.Less(t, time.Since(start), 50*time.Millisecond, "add must not wait for Redis")
	}
	s.close()
	<-s.done

	warns := logs.FilterMessage("reject_stream: rejects not recorded").All()
	require.NotEmpty(t, warns)
	assert.LessOrEqual(t, len(warns), 2, "at once, then at most once a minute (and a last count at close)")
	var failed int64
	for _, w := range warns {
		failed += w.ContextMap()["failed"].(int64)
		assert.Equal(t, "busy", w.ContextMap()["stream"])
	}
	assert.Equal(t, int64(5), failed, "every failure is counted")
}

func TestRejectStreamRequiresRedis(t *testing.T) {
	h := &Handler{Permits: 1, RejectStream: &RejectStreamConfig{Key: "busy"}}
	err := h.Provision(newContext(t))
	require.Error(t, err)
	assert.Contains(t, err.Error(), "reject_stream requires a redis block")
}

func TestRejectStreamConfigIsChecked(t *testing.T) {
	for _, tc := range []struct {
		cfg     RejectStreamConfig
		wantErr string
	}{
		{RejectStreamConfig{}, "reject_stream: key is required"},
		{RejectStreamConfig{Key: "k", MaxLen: -1}, "reject_stream: maxlen must be at least 1"},
		{RejectStreamConfig{Key: "k", Fields: map[string]string{"reason": "x"}}, "reject_stream: field 'reason' is built in"},
		{RejectStreamConfig{Key: "k", Fields: map[string]string{"": "x"}}, "reject_stream: a field name is empty"},
	} {
		err := tc.cfg.check()
		require.Error(t, err)
		assert.Contains(t, err.Error(), tc.wantErr)
	}
	many := RejectStreamConfig{Key: "k", Fields: map[string]string{}}
	for i := range maxRejectFields + 1 {
		many.Fields[strings.Repeat("f", i+1)] = "x"
	}
	assert.ErrorContains(t, many.check(), "at most 32 fields")
}

func TestTruncateUTF8CutsAtARuneBoundary(t *testing.T) {
	assert.Equal(t, "ab", truncateUTF8("ab", 4))
	assert.Equal(t, "a", truncateUTF8("aé", 2), "é is two bytes")
	assert.Equal(t, "aé", truncateUTF8("aéb", 3))
}
