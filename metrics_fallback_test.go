package caddyfairqueue

import (
	"context"
	"encoding/json"
	"net/http"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/internal/redistest"
)

// While Redis is unreachable and on_store_error local queues the
// requests in this instance alone, a request waiting there is a request
// of this instance waiting for a permit: node_waiting and the admin
// API's stats.waiting count it, as they count one waiting in Redis.
func TestRequestsWaitingInTheLocalFallbackAreInNodeWaiting(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	const name = "fallback-waiting"
	ctx := newContext(t)
	h := provision(t, ctx, deadAddr(t), &Handler{Name: name, Permits: 1, LocalPermits: 1,
		OnStoreError: FailLocal, MaxWait: caddy.Duration(time.Minute)})
	next := newHolder()
	running := newRequest(context.Background(), `{}`).start(h, next)
	next.waitEntered(t)
	waiting := newRequest(context.Background(), `{}`).start(h, next)
	t.Cleanup(func() {
		close(next.release)
		running.wait(t)
		waiting.wait(t)
	})

	reg := ctx.GetMetricsRegistry()
	var inFlight float64
	require.Eventually(t, func() bool {
		inFlight, _ = gauge(t, reg, "caddy_fair_queue_node_in_flight", name)
		return inFlight == 1
	}, 10*time.Second, 10*time.Millisecond, "the running request holds a local permit")
	assert.Eventually(t, func() bool {
		v, _ := gauge(t, reg, "caddy_fair_queue_node_waiting", name)
		return v == 1
	}, 5*time.Second, 10*time.Millisecond, "node_waiting counts the request waiting in the local fallback")

	rec, err := getStatus(t, http.MethodGet, "/fair_queue/")
	require.NoError(t, err)
	var rep statusReport
	require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &rep))
	require.Len(t, rep.Queues, 1, rec.Body.String())
	require.NotNil(t, rep.Queues[0].Stats)
	assert.Equal(t, 1, rep.Queues[0].Stats.Waiting, "the admin API's stats.waiting counts it too: %s", rec.Body.String())
	assert.Equal(t, 1, rep.Queues[0].Stats.InFlight, "stats.in_flight")
}

// When Redis is back, the requests waiting in the local fallback move
// into the shared queue and wait on there: no client is refused, so
// rejects_total counts nothing. The fallback queue's own end of their
// wait (shutting_down) was counted as a reject of the queue.
func TestWaitersMovedBackFromTheLocalFallbackAreNoRejects(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	const name = "fallback-moved"
	rds := redistest.Start(t)
	h := provision(t, newContext(t), rds.Addr(), &Handler{Name: name, Permits: 1, LocalPermits: 1,
		OnStoreError: FailLocal, MaxWait: caddy.Duration(time.Minute), Lease: caddy.Duration(1500 * time.Millisecond)})
	first := newRequest(context.Background(), `{}`).start(h, okHandler).wait(t)
	require.Equal(t, "granted", first.placeholder(phOutcome), "the queue joined Redis")

	rejects := func() float64 {
		n := 0.0
		for _, r := range reasons {
			n += testutil.ToFloat64(metrics.rejects.WithLabelValues(name, string(r)))
		}
		return n
	}
	before := rejects()
	rds.Kill()
	next := newHolder()
	running := newRequest(context.Background(), `{}`).start(h, next)
	next.waitEntered(t) // on a permit of the local fallback
	waiting := newRequest(context.Background(), `{}`).start(h, next)
	e := engineOf(t, h)
	require.Eventually(t, func() bool {
		snap, err := e.fallback.Inspect(context.Background(), 0, 0)
		return err == nil && snap.Waiting == 1
	}, 10*time.Second, 10*time.Millisecond, "the second request waits in the local fallback")

	rds.Restart()
	require.Eventually(t, func() bool {
		snap, err := e.fallback.Inspect(context.Background(), 0, 0)
		return err == nil && snap.Waiting == 0
	}, 20*time.Second, 10*time.Millisecond, "the waiter left the local fallback once Redis was back")
	next.release <- struct{}{}
	running.wait(t)
	next.waitEntered(t)
	next.release <- struct{}{}
	waiting.wait(t)
	require.Equal(t, "granted", running.placeholder(phOutcome))
	require.Equal(t, "granted", waiting.placeholder(phOutcome), "the waiter was served")
	assert.Equal(t, before, rejects(), "no request was refused")
	// It counted against max_waiting_bytes once, in the fallback and in
	// Redis alike: given back once.
	assert.Zero(t, waitingBytes.Load(), "bytes left counted")
}
