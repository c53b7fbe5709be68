package caddyfairqueue

import (
	"context"
	"fmt"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
	"github.com/fair-queue/caddy-fair-queue/internal/redistest"
)

// Every feature at once (queues named from the request, fair tenants
// capped in flight, priorities, a pool whose upstreams refuse with 429
// and cool, requests requeued, kv_tokens, cost tokens, a learned
// capacity and completion budget) leaves nothing in Redis once the
// config is unloaded.
func TestEveryFeatureLeavesNoKeyAfterTheConfigIsUnloaded(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	rds := redistest.Start(t)
	shared := func(h *Handler) *Handler {
		h.KVTokens, h.Cost = 4000, "tokens"
		h.Tenant, h.MaxInFlightPerTenant = "{http.request.header.X-Tenant}", 1
		h.Priority = "{http.request.header.X-Priority}"
		h.Adaptive = &AdaptiveConfig{TargetTTFT: caddy.Duration(time.Second), Interval: caddy.Duration(100 * time.Millisecond)}
		h.MaxWait = caddy.Duration(30 * time.Second)
		return provision(t, newContext(t), rds.Addr(), h)
	}
	pool := shared(&Handler{Name: "mix-pool", Permits: 3,
		Upstreams: []fairqueue.Upstream{{Dial: "a:1", Permits: 2}, {Dial: "b:1", Permits: 2}},
		RequeueOn: []int{429}, UpstreamCooldown: caddy.Duration(50 * time.Millisecond)})
	named := shared(&Handler{Name: "mix-{http.request.header.X-Queue}", Permits: 2})
	next := &pooled{answer: func(call int, _ string, w http.ResponseWriter) error {
		if call%4 == 0 && w.Header() != nil {
			return refuse(w, http.StatusTooManyRequests, "")
		}
		time.Sleep(5 * time.Millisecond)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusOK)
		_, _ = fmt.Fprintf(w, `{"usage":{"prompt_tokens":10,"completion_tokens":%d,"total_tokens":%d}}`, call%50, 10+call%50)
		return nil
	}}
	var wg sync.WaitGroup
	codes := make([]int, 120)
	for i := range codes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			req := newRequest(context.Background(), `{"model":"m","messages":[{"role":"user","content":"hello there"}]}`,
				"X-Queue", fmt.Sprint(i%7), "X-Tenant", fmt.Sprint("t", i%11), "X-Priority", fmt.Sprint(i%3))
			req.r = req.r.WithContext(context.WithValue(req.r.Context(), caddyhttp.VarsCtxKey, map[string]any{}))
			h := named
			if i%2 == 0 {
				h = pool
			}
			req.start(h, next).wait(t)
			codes[i] = req.w.Code
		}()
	}
	wg.Wait()
	served := 0
	for i, c := range codes {
		// A 429 passed on: its requeues ran out.
		require.Contains(t, []int{http.StatusOK, http.StatusTooManyRequests}, c, "request %d", i)
		if c == http.StatusOK {
			served++
		}
	}
	require.Greater(t, served, len(codes)/2)
	require.NotEmpty(t, rds.Keys(t, "{fair_queue:mix-*"), "the queues were in Redis")
	require.NoError(t, pool.Cleanup()) // the config is unloaded
	require.NoError(t, named.Cleanup())
	poolEmpty(t)
	assert.Empty(t, rds.Keys(t, "*"), "keys left in Redis after the config was unloaded")
}
