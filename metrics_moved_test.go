package caddyfairqueue

import (
	"context"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/internal/redistest"
)

// queueRejects is rejects_total of queue, every reason.
func queueRejects(queue string) float64 {
	n := 0.0
	for _, r := range reasons {
		n += testutil.ToFloat64(metrics.rejects.WithLabelValues(queue, string(r)))
	}
	return n
}

// A reload that moves a queue to another store moves its waiters into
// the new queue, where they wait on and are served: no client is
// refused, so rejects_total counts nothing. The old queue's end of their
// wait (shutting_down) was counted as a reject. What they count against
// max_waiting_bytes returns to nothing once they are served.
func TestWaitersMovedByAReloadAreNoRejects(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	const name = "moved-rejects"
	rds := redistest.Start(t)
	settings := func() *Handler { return &Handler{Name: name, Permits: 1, MaxWait: caddy.Duration(time.Minute)} }
	old := provision(t, newContext(t), rds.Addr(), settings())
	before := queueRejects(name)
	next := newHolder()
	running := newRequest(context.Background(), `{}`).start(old, next)
	next.waitEntered(t)
	waiting := newRequest(context.Background(), `{}`).start(old, next)
	waitingIn(t, old, 1)
	require.Positive(t, waitingBytes.Load(), "the waiter is not counted against max_waiting_bytes")

	// The reload: the new config keeps the queue in this process, serves
	// a request, and the old config is cleaned up (its queue moves).
	cur := provisionLocal(t, newContext(t), settings())
	third := newRequest(context.Background(), `{}`).start(cur, next)
	require.NoError(t, old.Cleanup())
	for range 2 { // each release lets the next request in
		next.release <- struct{}{}
		next.waitEntered(t)
	}
	close(next.release)
	for _, r := range []*request{running, waiting, third} {
		r.wait(t)
		require.Equal(t, "granted", r.placeholder(phOutcome), "every request is served")
	}
	assert.Equal(t, before, queueRejects(name), "no request was refused")
	// What the moved waiter counted against max_waiting_bytes is given
	// back once, as it was counted once.
	assert.Zero(t, waitingBytes.Load(), "bytes left counted")
}
