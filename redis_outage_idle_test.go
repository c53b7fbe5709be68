package caddyfairqueue

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/internal/redistest"
)

// An instance whose first request met Redis down (the queue never
// joined: Caddy started, or loaded a config, during the outage) reads up
// again once Redis is back, with no request: store_up, which an alert
// watches, and the admin API's store_up do not stay 0 until the next
// request comes.
func TestStoreNeverJoinedReadsUpOnceRedisIsBackWithoutRequests(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	const name = "outage-never-joined"
	rds := redistest.Start(t)
	rds.Stop()
	ctx := newContext(t)
	h := provision(t, ctx, rds.Addr(), &Handler{Name: name, Permits: 1, OnStoreError: FailClosed})

	req := newRequest(context.Background(), `{}`).start(h, okHandler).wait(t)
	require.Equal(t, http.StatusServiceUnavailable, req.w.Code)
	up, ok := gauge(t, ctx.GetMetricsRegistry(), "caddy_fair_queue_store_up", name)
	require.True(t, ok)
	require.Equal(t, 0.0, up, "down from the first request answered by on_store_error")

	rds.Restart()
	assert.Eventually(t, func() bool {
		up, _ := gauge(t, ctx.GetMetricsRegistry(), "caddy_fair_queue_store_up", name)
		return up == 1
	}, 20*time.Second, 100*time.Millisecond, "store_up reads 1 once Redis answers again, with no request")
	for _, e := range h.engineList() {
		assert.True(t, e.q.Stats().StoreUp, "the admin API agrees")
	}

	req = newRequest(context.Background(), `{}`).start(h, okHandler).wait(t)
	assert.Equal(t, http.StatusOK, req.w.Code, "and the next request is served through Redis")
}
