package caddyfairqueue

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
	"github.com/fair-queue/caddy-fair-queue/internal/redistest"
)

// A reload that moves a queue to another store (here Redis to local; a
// changed Redis client option does the same) retires the old engine,
// which stays open while the old config's requests run: they still hold
// their permits, and the new queue counts them against its own. The
// gauges must still show them: node_in_flight is the permits this
// instance's requests hold. The retired engine left the registry, and
// with it the gauges (and the admin API): node_in_flight read 0 while a
// request of this instance ran (and the new queue counted it against
// its permits).
func TestARetiredQueuesRunningRequestsStayInNodeInFlight(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	rds := redistest.Start(t)
	const name = "retired-in-flight"
	oldCtx := newContext(t)
	old := provision(t, oldCtx, rds.Addr(), &Handler{Name: name, Permits: 1, MaxWait: caddy.Duration(time.Minute)})
	next := newHolder()
	running := newRequest(context.Background(), `{}`).start(old, next)
	t.Cleanup(func() { running.wait(t) })
	t.Cleanup(func() { close(next.release) }) // first: cleanups run last in, first out
	next.waitEntered(t)

	ctx := newContext(t)
	provisionLocal(t, ctx, &Handler{Name: name, Permits: 1, MaxWait: caddy.Duration(time.Minute)})
	require.NoError(t, old.Cleanup()) // the old config is cleaned up; its request runs on

	reg := ctx.GetMetricsRegistry()
	v, ok := gauge(t, reg, "caddy_fair_queue_node_in_flight", name)
	require.True(t, ok)
	assert.Equal(t, 1.0, v, "the old config's request holds a permit on this instance")
	st := queueStatus(context.Background())
	inFlight := 0
	for _, q := range st.Queues {
		if q.Name == name {
			inFlight += q.Stats.InFlight
		}
	}
	assert.Equal(t, 1, inFlight, "the admin API shows it too")
}

// The queue a reload retired in another store is not the queue of the
// config in force: its permits are not this instance's configuration,
// and caddy_fair_queue_permits ("as configured here") reads the new
// config's alone while the old queue's request runs. It read their sum
// (5: the old 4 and the new 1), and the dashboard's saturation with it.
func TestARetiredQueueInAnotherStoreLeavesThePermitsGauge(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	rds := redistest.Start(t)
	const name = "retired-permits"
	old := provision(t, newContext(t), rds.Addr(), &Handler{Name: name, Permits: 4, MaxWait: caddy.Duration(time.Minute)})
	next := newHolder()
	running := newRequest(context.Background(), `{}`).start(old, next)
	t.Cleanup(func() { running.wait(t) })
	t.Cleanup(func() { close(next.release) })
	next.waitEntered(t)

	ctx := newContext(t)
	provisionLocal(t, ctx, &Handler{Name: name, Permits: 1, MaxWait: caddy.Duration(time.Minute)})
	require.NoError(t, old.Cleanup())

	reg := ctx.GetMetricsRegistry()
	permits, ok := gauge(t, reg, "caddy_fair_queue_permits", name)
	require.True(t, ok)
	assert.Equal(t, 1.0, permits, "the permits of the config in force")
	inFlight, _ := gauge(t, reg, "caddy_fair_queue_node_in_flight", name)
	assert.Equal(t, 1.0, inFlight, "the old config's request still counts here")
}

// As TestARetiredQueueInAnotherStoreLeavesThePermitsGauge, for a pool:
// each upstream's permits and kv_tokens are the config in force's.
func TestARetiredPoolInAnotherStoreLeavesTheUpstreamPermitsGauges(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	rds := redistest.Start(t)
	const name = "retired-pool-permits"
	pool := func(permits, tokens int) *Handler {
		return &Handler{Name: name, MaxWait: caddy.Duration(time.Minute),
			Upstreams: []fairqueue.Upstream{{Dial: "a:1", Permits: permits, KVTokens: tokens}}}
	}
	old := provision(t, newContext(t), rds.Addr(), pool(4, 4000))
	next := newHolder()
	running := poolRequest(context.Background()).start(old, next)
	t.Cleanup(func() { running.wait(t) })
	t.Cleanup(func() { close(next.release) })
	next.waitEntered(t)

	ctx := newContext(t)
	provisionLocal(t, ctx, pool(1, 1000))
	require.NoError(t, old.Cleanup())

	got := queueGaugeValues(t, ctx.GetMetricsRegistry(), name)
	assert.Equal(t, 1.0, got["upstream_permits a:1"], "the upstream's permits in force: %v", got)
	assert.Equal(t, 1000.0, got["upstream_kv_tokens_capacity a:1"], "its kv_tokens in force: %v", got)
	assert.Equal(t, 1000.0, got["kv_tokens_capacity"], "the queue's kv_tokens in force: %v", got)
}

// A request the handler refuses because it cannot open its queue (a name
// over 200 bytes, or beyond the cap of 100 queues) is answered 429
// queue_full and counted in requests_total{queue="(overflow)",
// outcome="queue_full"}, but rejects_total ("Requests refused ... by
// reason", the dashboard's "Rejects per second by reason") never sees it:
// only the engine's observer counts rejects, and there is no engine.
// max_waiting_bytes, the other reject without an engine's say, is
// counted in both.
func TestAnOverflowRejectIsCountedInRejectsTotal(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	h := provisionLocal(t, newContext(t), &Handler{Name: "ovf-{http.request.header.X-Queue}", Permits: 1})
	rejects := metrics.rejects.WithLabelValues(overflowQueue, string(fairqueue.ReasonQueueFull))
	requests := metrics.requests.WithLabelValues(overflowQueue, string(fairqueue.ReasonQueueFull))
	r0, q0 := testutil.ToFloat64(rejects), testutil.ToFloat64(requests)
	req := newRequest(context.Background(), `{}`, "X-Queue", strings.Repeat("n", maxQueueNameLen+1)).start(h, okHandler).wait(t)
	require.Equal(t, "queue_full", req.placeholder(phOutcome))
	assert.Equal(t, q0+1, testutil.ToFloat64(requests), "requests_total counts it")
	assert.Equal(t, r0+1, testutil.ToFloat64(rejects), "rejects_total counts it too")
}
