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

// On exit every waiter is answered with shutting_down at once: a request
// that reaches a handler whose server is shutting down (its body still
// arriving as the shutdown began, an HTTP/2 stream already open) and names
// a queue the handler had not opened yet must not wait in a new queue
// until its max_wait, holding the grace period up.
func TestShutdownAnswersARequestForANewQueueNameAtOnce(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	rds := redistest.Start(t)
	// Another instance of the cluster (another Redis client of the same
	// Redis: its own engine) runs queue "b" at its only permit.
	other := provision(t, newContext(t), rds.Addr(), &Handler{Name: "b", Permits: 1, Redis: &RedisConfig{
		Addresses: []string{rds.Addr()}, ReadTimeout: caddy.Duration(7 * time.Second),
	}})
	next := newHolder()
	running := newRequest(context.Background(), `{}`).start(other, next)
	next.waitEntered(t)

	h := provision(t, newContext(t), rds.Addr(), &Handler{Name: "{http.fair_queue.model}", Permits: 1,
		MaxWait: caddy.Duration(3 * time.Second)})
	require.Equal(t, http.StatusOK, model(t, h, "a").w.Code)
	h.onShutdown(true) // SIGTERM

	start := time.Now()
	late := newRequest(context.Background(), `{"model":"b"}`).start(h, okHandler).wait(t)
	waited := time.Since(start)
	assert.Equal(t, "shutting_down", late.placeholder(phOutcome), "a request after the shutdown began")
	assert.Less(t, waited, time.Second, "it waited for its max_wait during the shutdown")

	next.release <- struct{}{}
	running.wait(t)
}
