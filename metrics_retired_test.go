package caddyfairqueue

import (
	"context"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

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
