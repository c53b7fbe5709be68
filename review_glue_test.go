package caddyfairqueue

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
	"github.com/fair-queue/caddy-fair-queue/internal/redistest"
)

// A request of the old config whose pool upstream refuses it (requeue_on)
// after a reload moved its queue to another store waits again like any
// other waiter of the moved queue: in the queue of the config in force.
// It is not answered shutting_down: the server is not shutting down.
func TestRequeueAfterAReloadMovedTheQueueWaitsInTheNewStore(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	rds := redistest.Start(t)
	settings := func() *Handler {
		return &Handler{Name: "mv-requeue", Upstreams: []fairqueue.Upstream{{Dial: "a:1", Permits: 2}},
			RequeueOn: []int{503}, MaxWait: caddy.Duration(10 * time.Second)}
	}
	old := provisionLocal(t, newContext(t), settings())
	entered, refuseNow := make(chan struct{}, 1), make(chan struct{})
	next := &pooled{answer: func(call int, _ string, w http.ResponseWriter) error {
		if call == 1 {
			entered <- struct{}{}
			<-refuseNow
			return refuse(w, http.StatusServiceUnavailable, "")
		}
		return answerOK(w)
	}}
	req := poolRequest(context.Background()).start(old, next)
	select {
	case <-entered:
	case <-time.After(10 * time.Second):
		t.Fatal("not forwarded")
	}

	// The reload: the new config keeps the queue in Redis, serves, and the
	// old config is cleaned up (its queue retires and moves).
	curSettings := settings()
	cur := provision(t, newContext(t), rds.Addr(), curSettings)
	first := poolRequest(context.Background()).start(cur, &pooled{answer: func(_ int, _ string, w http.ResponseWriter) error { return answerOK(w) }}).wait(t)
	require.Equal(t, http.StatusOK, first.w.Code)
	require.NoError(t, old.Cleanup())

	close(refuseNow) // the old config's upstream refuses: the request waits again
	req.wait(t)
	assert.Equal(t, http.StatusOK, req.w.Code, "reason %q, body %s", req.w.Header().Get("Fair-Queue-Reason"), req.w.Body.String())
	assert.Len(t, next.calls, 2, "sent again once granted in the queue in force")
}
