package caddyfairqueue

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
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

// The time to first byte of a requeued stream is its upstream's, from
// the forward that the upstream answered: not the moment the keepalive
// fed the client while the request waited again. (Adaptive learns the
// upstream's capacity from it.)
func TestRequeuedStreamTimesItsFirstByteFromTheUpstream(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	const name = "fb-requeue"
	h := provisionLocal(t, newContext(t), &Handler{Name: name,
		Upstreams: []fairqueue.Upstream{{Dial: "a:1", Permits: 1}}, RequeueOn: []int{503},
		SSEKeepalive: caddy.Duration(100 * time.Millisecond)})
	next := &pooled{answer: func(call int, _ string, w http.ResponseWriter) error {
		if call == 1 {
			return refuse(w, http.StatusServiceUnavailable, "1") // the upstream cools 1 s: the request waits again
		}
		time.Sleep(300 * time.Millisecond) // the upstream thinks
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(http.StatusOK)
		_, _ = w.Write([]byte("data: [DONE]\n\n"))
		return nil
	}}
	n0, sum0 := firstByteSamples(t, name, "a:1")
	req := newRequest(context.Background(), `{"model":"m","stream":true,"messages":[]}`)
	req.r = req.r.WithContext(context.WithValue(req.r.Context(), caddyhttp.VarsCtxKey, map[string]any{}))
	req.start(h, next).wait(t)
	require.NoError(t, req.err)
	require.Len(t, next.calls, 2)
	require.Contains(t, req.w.Body.String(), ": queued", "the keepalive fed the client while it waited again")
	n, sum := firstByteSamples(t, name, "a:1")
	require.Equal(t, n0+1, n)
	assert.GreaterOrEqual(t, sum-sum0, 0.3, "the upstream's first byte came 300 ms after the forward")
}
