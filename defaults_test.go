package caddyfairqueue

import (
	"encoding/json"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
)

// TestEveryDocumentedDefaultIsTheOneInForce provisions handlers from
// the least JSON each option allows and checks every default that
// docs/reference.md and the fields' doc state, where it is applied: the
// queue's engine, the handler's resolved options, the Redis client, the
// reject answers.
func TestEveryDocumentedDefaultIsTheOneInForce(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	load := func(t *testing.T, fields string) *Handler {
		t.Helper()
		h := new(Handler)
		require.NoError(t, json.Unmarshal([]byte("{"+fields+"}"), h))
		require.NoError(t, h.Provision(newContext(t)))
		t.Cleanup(func() { _ = h.Cleanup() })
		return h
	}
	const MiB = 1 << 20
	for _, tc := range []struct {
		name, fields string
		check        func(t *testing.T, h *Handler)
	}{
		{"queue", `"permits":1`, func(t *testing.T, h *Handler) {
			assert.Equal(t, "default", h.Name, "name")
			assert.Equal(t, int64(8*MiB), h.MaxBody, "max_body")
			assert.Equal(t, 30*time.Second, time.Duration(h.BodyTimeout), "body_timeout")
			assert.Equal(t, int64(256*MiB), h.MaxWaitingBytes, "max_waiting_bytes")
			assert.Equal(t, 50*time.Millisecond, h.abortGrace(), "abort_grace")
			assert.Equal(t, FailOpen, h.OnStoreError, "on_store_error")
			assert.Equal(t, 1024, h.defaultMaxTokens(), "default_max_tokens before any is learned")
			assert.True(t, h.learnsBudget(), "default_max_tokens: learned")
			assert.Zero(t, h.SSEKeepalive, "sse_keepalive: off")
			cfg := engineOf(t, h).q.Config()
			assert.Equal(t, 20*time.Second, cfg.MaxWait, "max_wait")
			assert.Equal(t, 200*time.Millisecond, cfg.PollInterval, "poll_interval")
			assert.Equal(t, 30*time.Second, cfg.Lease, "lease")
			assert.Equal(t, 8.0, cfg.PriorityFactor, "priority_factor")
			assert.True(t, cfg.FailOpen, "on_store_error fail_open")
			assert.False(t, cfg.Fair, "tenant: none, strict FIFO")
			assert.Zero(t, cfg.KVTokens, "kv_tokens: not counted")
			assert.Zero(t, cfg.MaxQueue, "max_queue: no cap")
			assert.Zero(t, cfg.MaxQueuePerTenant, "max_queue_per_tenant: no cap")
			assert.Zero(t, cfg.MaxInFlightPerTenant, "max_in_flight_per_tenant: no cap")
			assert.Nil(t, cfg.Adaptive, "adaptive: off")
		}},
		{"short max_wait", `"permits":1,"max_wait":"120ms"`, func(t *testing.T, h *Handler) {
			assert.Equal(t, 120*time.Millisecond, engineOf(t, h).q.Config().PollInterval, "poll_interval: max_wait when shorter")
		}},
		{"large max_body", `"permits":1,"max_body":536870912`, func(t *testing.T, h *Handler) {
			assert.Equal(t, int64(512*MiB), h.MaxWaitingBytes, "max_waiting_bytes: max_body when larger")
		}},
		{"cost max_tokens", `"permits":1,"tenant":"{http.request.remote.host}","cost":"max_tokens"`, func(t *testing.T, h *Handler) {
			assert.Equal(t, 32768, h.MaxCost, "max_cost")
			assert.True(t, engineOf(t, h).q.Config().Fair)
		}},
		{"cost tokens", `"permits":1,"tenant":"{http.request.remote.host}","cost":"tokens"`, func(t *testing.T, h *Handler) {
			assert.Equal(t, 32768, h.MaxCost, "max_cost")
		}},
		{"pool", `"upstreams":[{"dial":"127.0.0.1:9","permits":2},{"dial":"127.0.0.1:10","permits":3}]`, func(t *testing.T, h *Handler) {
			assert.Equal(t, 3, h.maxRequeues(), "max_requeues")
			assert.Equal(t, time.Second, h.upstreamCooldown(), "upstream_cooldown")
			assert.Equal(t, 5, engineOf(t, h).q.Config().Permits, "permits: the upstreams' sum")
		}},
		{"pool tokens", `"upstreams":[{"dial":"127.0.0.1:9","permits":2,"kv_tokens":100},{"dial":"127.0.0.1:10","permits":3,"kv_tokens":50}]`, func(t *testing.T, h *Handler) {
			assert.Equal(t, 150, engineOf(t, h).q.Config().KVTokens, "kv_tokens: the upstreams' sum")
		}},
		{"tokens alone", `"kv_tokens":1000`, func(t *testing.T, h *Handler) {
			assert.Equal(t, fairqueue.MaxPermits, engineOf(t, h).q.Config().Permits, "permits without permits: 1048576")
		}},
		{"rejects", `"permits":1`, func(t *testing.T, h *Handler) {
			for r, status := range map[fairqueue.Reason]int{
				fairqueue.ReasonTimeout: 429, fairqueue.ReasonQueueFull: 429,
				fairqueue.ReasonShuttingDown: 503, fairqueue.ReasonStoreUnavailable: 503,
			} {
				p := h.policies[r]
				require.NotNil(t, p, "reject %s", r)
				assert.Equal(t, status, p.status, "reject %s: status", r)
				assert.Equal(t, http.StatusOK, p.sseStatus, "reject %s: sse_status", r)
				assert.Equal(t, "error", p.sseEvent, "reject %s: sse_event", r)
				assert.Zero(t, p.retryAfter, "reject %s: retry_after auto", r)
				assert.Empty(t, p.body, "reject %s: the default error object", r)
				assert.Empty(t, p.sseData, "reject %s: the default error object", r)
			}
		}},
		{"redis", `"permits":1,"redis":{}`, func(t *testing.T, h *Handler) {
			rb, ok := h.backend.(*redisBackend)
			require.True(t, ok)
			assert.Equal(t, ModeStandalone, rb.mode, "redis mode")
			assert.Equal(t, "127.0.0.1:6379", rb.opts.Addr, "redis address")
			assert.Equal(t, "fair_queue", rb.prefix, "redis key_prefix")
			assert.Zero(t, rb.opts.DB, "redis db")
			assert.Nil(t, rb.opts.TLSConfig, "redis tls")
			assert.Equal(t, 2, rb.opts.Protocol, "RESP2 by default")
			assert.Equal(t, 500*time.Millisecond, rb.opts.DialTimeout, "redis dial_timeout")
			assert.Equal(t, 500*time.Millisecond, rb.opts.ReadTimeout, "redis read_timeout")
			assert.Equal(t, 500*time.Millisecond, rb.opts.WriteTimeout, "redis write_timeout")
		}},
		{"reject_stream", `"permits":1,"redis":{},"reject_stream":{"key":"rejects"}`, func(t *testing.T, h *Handler) {
			require.NotNil(t, h.rejects)
			assert.Equal(t, int64(10000), h.rejects.maxLen, "reject_stream maxlen")
		}},
	} {
		t.Run(tc.name, func(t *testing.T) { tc.check(t, load(t, tc.fields)) })
	}
	// The adaptive block's defaults are applied by the engine itself:
	// the numbers it applies are the documented ones.
	assert.Equal(t, 0.0625, fairqueue.DefaultAdaptiveFloor, "adaptive floor")
	assert.Equal(t, time.Second, fairqueue.DefaultAdaptiveInterval, "adaptive interval")
	assert.Equal(t, 0.9, fairqueue.DefaultAdaptiveDecrease, "adaptive decrease")
	assert.Equal(t, 0.015625, fairqueue.DefaultAdaptiveStep, "adaptive step")
	assert.Equal(t, 0.01, fairqueue.DefaultAdaptiveBreachShare, "adaptive breach_share")
}
