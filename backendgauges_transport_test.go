package caddyfairqueue

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httptrace"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/stretchr/testify/require"
)

// Another part of the process (another Caddy module, a library) that
// keeps a connection alive through Go's default transport must keep it
// when a queue stops reading its backend's gauges (a reload, a stop): the
// watch closes its own idle connections, not every user's of
// http.DefaultTransport.
func TestBackendGaugesStopLeavesTheDefaultTransportsConnectionsAlone(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	var reads atomic.Int64
	metrics := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		reads.Add(1)
		_, _ = io.WriteString(w, "vllm:num_preemptions_total{model_name=\"m\"} 0\nvllm:num_requests_waiting{model_name=\"m\"} 0\n")
	}))
	t.Cleanup(metrics.Close)
	other := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		_, _ = io.WriteString(w, "ok")
	}))
	t.Cleanup(other.Close)
	// get fetches other's page with http.DefaultClient and says whether
	// it came on a connection kept alive since the last fetch.
	get := func() bool {
		reused := false
		ctx := httptrace.WithClientTrace(context.Background(), &httptrace.ClientTrace{
			GotConn: func(i httptrace.GotConnInfo) { reused = i.Reused },
		})
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, other.URL, nil)
		require.NoError(t, err)
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		_, _ = io.Copy(io.Discard, resp.Body)
		require.NoError(t, resp.Body.Close())
		return reused
	}
	get()
	require.True(t, get(), "the default transport keeps the connection alive")

	h := provisionLocal(t, newContext(t), &Handler{Name: "gauges-transport", Permits: 4,
		Adaptive: &AdaptiveConfig{TargetTTFT: caddy.Duration(time.Second),
			Interval: caddy.Duration(100 * time.Millisecond), BackendMetrics: metrics.URL}})
	require.Eventually(t, func() bool { return reads.Load() >= 2 }, 20*time.Second, 10*time.Millisecond,
		"the gauges are read")
	require.NoError(t, h.Cleanup()) // the queue stops: so does its watch
	require.True(t, get(), fmt.Sprintf("stopping the gauge watch closed the idle connections of http.DefaultTransport (%d reads)", reads.Load()))
}
