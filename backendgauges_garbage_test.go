package caddyfairqueue

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
)

// tgiMetrics is a page of Prometheus text without vLLM's or SGLang's
// gauges: Text Generation Inference's /metrics, which backend_metrics
// does not read.
const tgiMetrics = `# HELP tgi_queue_size Current queue size
# TYPE tgi_queue_size gauge
tgi_queue_size 12
# HELP tgi_batch_current_size Current batch size
# TYPE tgi_batch_current_size gauge
tgi_batch_current_size 32
`

// A page that shows neither vLLM's nor SGLang's gauges (another engine's
// metrics, a login or index page answered 200 on a wrong path) tells
// nothing of the backend: reading it as a backend that neither preempts
// nor queues would be a sample under the target.
func TestBackendGaugesAPageWithoutThemIsAReadThatFailed(t *testing.T) {
	for name, page := range map[string]string{
		"another engine's metrics": tgiMetrics,
		"an HTML page":             "<!doctype html><html><body>Sign in</body></html>\n",
		"an empty page":            "",
	} {
		t.Run(name, func(t *testing.T) {
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, page) }))
			defer srv.Close()
			_, err := readGauges(context.Background(), srv.Client(), srv.URL, time.Second)
			require.Error(t, err, "a page without vLLM's or SGLang's gauges read as a backend that neither preempts nor queues")
			assert.Contains(t, err.Error(), "vllm:num_requests_waiting")
		})
	}
}

// Through the queue: its share, halved by a refusal, must not climb back
// on readings of a page that shows no gauge while requests wait (the
// backend may be as overloaded as when it refused): nothing says it has
// room.
func TestBackendGaugesAPageWithoutThemDoesNotRaiseTheCapacity(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	var reads atomic.Int32
	metrics := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		reads.Add(1)
		_, _ = io.WriteString(w, tgiMetrics)
	}))
	t.Cleanup(metrics.Close)
	next, _ := refusingUpstream(t)
	h := provisionLocal(t, newContext(t), &Handler{Name: "gauges-garbage", Permits: 2, MaxWait: caddy.Duration(5 * time.Second),
		Adaptive: &AdaptiveConfig{TargetTTFT: caddy.Duration(time.Second), MinSamples: 2, Interval: caddy.Duration(100 * time.Millisecond),
			Decrease: 0.5, Step: 0.25, BackendMetrics: metrics.URL}})
	resp := serve(t, h, next).post(t, context.Background(), `{"model":"m"}`)
	_, _ = io.Copy(io.Discard, resp.Body)
	_ = resp.Body.Close()
	require.Equal(t, http.StatusTooManyRequests, resp.StatusCode)
	q := engineOf(t, h).q
	require.Eventually(t, func() bool { return q.Share() == 0.5 }, 5*time.Second, 10*time.Millisecond,
		"the upstream's 429 did not halve the share: %v", q.Shares())

	// The one permit in force held; requests keep waiting for it.
	p, err := q.Acquire(context.Background(), fairqueue.Request{})
	require.NoError(t, err)
	defer p.Release()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ctx.Err() == nil {
			if p, err := q.Acquire(ctx, fairqueue.Request{MaxWait: 150 * time.Millisecond}); err == nil {
				p.Release()
			}
		}
	}()
	defer func() { cancel(); <-done }()
	from := reads.Load()
	require.Eventually(t, func() bool { return reads.Load() >= from+20 }, 20*time.Second, 10*time.Millisecond)
	assert.Equal(t, 0.5, q.Share(), "20 readings of a page without gauges raised the capacity while requests waited")
}
