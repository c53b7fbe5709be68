package caddyfairqueue

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A reload that points backend_metrics at another backend (the model
// moved to a new server) must not count the new backend's preemptions
// since it started as preempted since the last read of the old one: here
// neither backend preempts anything while the queue reads it, and the
// share must stay whole.
func TestBackendGaugesOfAnotherBackendAfterAReloadStartAfresh(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	gauges := func(preemptions int, reads *atomic.Int32) *httptest.Server {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			reads.Add(1)
			_, _ = fmt.Fprintf(w, "vllm:num_preemptions_total{model_name=\"m\"} %d\nvllm:num_requests_waiting{model_name=\"m\"} 0\n", preemptions)
		}))
		t.Cleanup(srv.Close)
		return srv
	}
	var readsA, readsB atomic.Int32
	a, b := gauges(10, &readsA), gauges(5000, &readsB) // b has run for weeks
	handler := func(url string) *Handler {
		return &Handler{Name: "gauges-moved", Permits: 4,
			Adaptive: &AdaptiveConfig{TargetTTFT: caddy.Duration(time.Second), MinSamples: 1, Decrease: 0.5,
				Interval: caddy.Duration(100 * time.Millisecond), BackendMetrics: url}}
	}
	upstream := proxyTo(t, http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		_, _ = io.WriteString(w, "data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}]}\n\ndata: [DONE]\n\n")
	}))
	old := provisionLocal(t, newContext(t), handler(a.URL))
	srv := serve(t, old, upstream)
	stream := func(srv *served) {
		resp := srv.post(t, context.Background(), `{"model":"m","stream":true}`)
		_, _ = io.Copy(io.Discard, resp.Body)
		_ = resp.Body.Close()
		srv.outcome(t)
	}
	stream(srv) // joins the queue
	require.Eventually(t, func() bool { return readsA.Load() >= 3 }, 5*time.Second, 10*time.Millisecond)

	updated := provisionLocal(t, newContext(t), handler(b.URL))
	require.NoError(t, old.Cleanup())
	srv = serve(t, updated, upstream)
	q := engineOf(t, updated).q
	for readsB.Load() < 4 {
		stream(srv)
		time.Sleep(100 * time.Millisecond)
	}
	stream(srv)
	time.Sleep(300 * time.Millisecond) // the last reports' answers
	assert.Equal(t, 1.0, q.Share(), "neither backend preempted anything: b's 5000 since it started counted as preempted since a's last read")
}
