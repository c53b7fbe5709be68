package caddyfairqueue

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
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

// probeBound is how soon, by docs/failures.md ("the instance probes once
// a second, idle or not"), an instance finds Redis back: a second, with
// a margin for a loaded machine. The test's poll_interval is four times
// as long.
const probeBound = 5 * time.Second

// docs/failures.md, "When Redis fails": "One successful call marks it up
// again: the instance probes once a second, idle or not". While the
// store is marked down, on_store_error answers every request without a
// call, so only that probe ends the outage for the instance's clients.
// A joined instance with a poll_interval of 20s (and a lease of minutes:
// its loop ticks every 20s) whose store was marked down by a frozen
// Redis (SIGSTOP: its grant subscription stays connected, so no new
// subscription wakes the loop once Redis answers again, as one does
// after a restart) reads up again, and serves its next request through
// Redis, within about a second of Redis answering again, not at the
// loop's next tick.
func TestJoinedStoreReadsUpWithinASecondOfRedisBeingBack(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	const name = "outage-joined-probe"
	rds := redistest.Start(t)
	ctx := newContext(t)
	h := provision(t, ctx, rds.Addr(), &Handler{Name: name, Permits: 1, OnStoreError: FailClosed,
		MaxWait: caddy.Duration(30 * time.Second), PollInterval: caddy.Duration(4 * probeBound),
		Lease: caddy.Duration(10 * time.Minute)})
	joined := time.Now()
	require.Equal(t, http.StatusOK, newRequest(context.Background(), `{}`).start(h, okHandler).wait(t).w.Code)
	settled(t, h)

	rds.Freeze()
	thawed := false
	t.Cleanup(func() {
		if !thawed {
			rds.Thaw()
		}
	})
	req := newRequest(context.Background(), `{}`).start(h, okHandler).wait(t)
	require.Equal(t, http.StatusServiceUnavailable, req.w.Code)
	require.Equal(t, "store_unavailable", req.w.Header().Get("Fair-Queue-Reason"))
	require.False(t, storeUp(h), "the store is marked down")
	time.Sleep(2 * time.Second) // the probes meanwhile fail

	rds.Thaw()
	thawed = true
	back := time.Now()
	// The loop's next tick is a poll_interval after the join: the probe
	// looked for must come before it.
	require.Less(t, back.Sub(joined)+probeBound, 4*probeBound, "the setup took too long to tell the probe from the tick")
	up := assert.Eventually(t, func() bool {
		up, _ := gauge(t, ctx.GetMetricsRegistry(), "caddy_fair_queue_store_up", name)
		return up == 1
	}, probeBound, 20*time.Millisecond, "store_up reads 1 within about a second of Redis answering again, with no request")
	t.Logf("%v after Redis answered again the store reads up: %v", time.Since(back), up)
	assert.True(t, storeUp(h), "the admin API agrees")
	req = newRequest(context.Background(), `{}`).start(h, okHandler).wait(t)
	assert.Equal(t, http.StatusOK, req.w.Code, "the next request is served through Redis")
}
