package caddyfairqueue

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
	"github.com/fair-queue/caddy-fair-queue/fairqueue/memstore"
)

// gauge returns the value of gauge name{queue} in reg, and whether it
// was reported.
func gauge(t *testing.T, reg prometheus.Gatherer, name, queue string) (float64, bool) {
	t.Helper()
	mfs, err := reg.Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "queue" && l.GetValue() == queue {
					return m.GetGauge().GetValue(), true
				}
			}
		}
	}
	return 0, false
}

// handoffs returns the number of handoffs observed for queue.
func handoffs(t *testing.T, queue string) uint64 {
	t.Helper()
	var m dto.Metric
	require.NoError(t, metrics.handoff.WithLabelValues(queue).(prometheus.Histogram).Write(&m))
	return m.GetHistogram().GetSampleCount()
}

func TestObserverCountsGrantsRejectsHandoffsAndStoreErrors(t *testing.T) {
	const label = "observer-test"
	obs := newObserver(label)
	q, err := fairqueue.New(memstore.New(), fairqueue.Config{
		Name: label, Permits: 1, MaxWait: 10 * time.Second, PollInterval: 50 * time.Millisecond, Observer: obs,
	})
	require.NoError(t, err)
	t.Cleanup(func() { _ = q.Close() })
	grants := metrics.grants.WithLabelValues(label)
	timeouts := metrics.rejects.WithLabelValues(label, string(fairqueue.ReasonTimeout))
	g0, r0, h0 := testutil.ToFloat64(grants), testutil.ToFloat64(timeouts), handoffs(t, label)

	p, err := q.Acquire(context.Background(), fairqueue.Request{})
	require.NoError(t, err)
	assert.Equal(t, g0+1, testutil.ToFloat64(grants), "the fast path counts a grant")

	_, err = q.Acquire(context.Background(), fairqueue.Request{MaxWait: 100 * time.Millisecond})
	require.ErrorIs(t, err, fairqueue.ErrTimeout)
	assert.Equal(t, r0+1, testutil.ToFloat64(timeouts), "a timeout counts a reject with its reason")

	granted := make(chan *fairqueue.Permit, 1)
	queued := make(chan struct{})
	go func() {
		p2, err := q.Acquire(context.Background(), fairqueue.Request{OnQueued: func(fairqueue.Waiting) { close(queued) }})
		assert.NoError(t, err)
		granted <- p2
	}()
	// Queued in the store, not only known to the node (Stats counts a
	// ticket from before its acquire reaches the store): released
	// earlier, the permit would go to it by the fast path, no handoff.
	select {
	case <-queued:
	case <-time.After(5 * time.Second):
		t.Fatal("the second acquire was not queued")
	}
	p.Release()
	p2 := <-granted
	require.NotNil(t, p2)
	defer p2.Release()
	assert.Equal(t, g0+2, testutil.ToFloat64(grants), "a handed-off permit counts a grant")
	// The wake-up message may arrive after a reconcile granted the
	// ticket; it is observed either way while the permit is held.
	assert.Eventually(t, func() bool { return handoffs(t, label) == h0+1 }, 5*time.Second, 5*time.Millisecond,
		"the handoff is in the histogram")

	errs := metrics.storeErrors.WithLabelValues(label)
	e0 := testutil.ToFloat64(errs)
	obs.StoreError(errors.New("connection refused"))
	assert.Equal(t, e0+1, testutil.ToFloat64(errs))

	// A reason newer than this file is still counted, under its name.
	newer := metrics.rejects.WithLabelValues(label, "brand_new")
	n0 := testutil.ToFloat64(newer)
	obs.Rejected("brand_new", 0)
	assert.Equal(t, n0+1, testutil.ToFloat64(newer))
}

func TestRegisteringMetricsInEveryConfigRegistryIsIdempotent(t *testing.T) {
	reg := prometheus.NewRegistry()
	registerMetrics(reg)
	registerMetrics(reg) // a second handler of the same config
	registerMetrics(prometheus.NewRegistry())
	registerMetrics(nil)
	problems, err := testutil.GatherAndLint(reg)
	require.NoError(t, err)
	assert.Empty(t, problems, "metric names and help follow Prometheus conventions")
}

func TestHandlerMetricsShowNodeAndClusterViewsAndCountOutcomes(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	const name = "metrics-handler"
	ctx := newContext(t)
	h := &Handler{Name: name, Permits: 1, MaxWait: caddy.Duration(time.Second),
		PollInterval: caddy.Duration(50 * time.Millisecond), Lease: caddy.Duration(time.Second)}
	require.NoError(t, h.Provision(ctx))
	t.Cleanup(func() { _ = h.Cleanup() })
	reg := ctx.GetMetricsRegistry()
	require.NotNil(t, reg)
	value := func(metric string) float64 {
		v, ok := gauge(t, reg, "caddy_fair_queue_"+metric, name)
		require.True(t, ok, "%s{queue=%q} reported", metric, name)
		return v
	}
	grants := metrics.grants.WithLabelValues(name)
	timeouts := metrics.rejects.WithLabelValues(name, string(fairqueue.ReasonTimeout))
	requests := metrics.requests.WithLabelValues(name, string(fairqueue.ReasonTimeout))
	g0, r0, q0 := testutil.ToFloat64(grants), testutil.ToFloat64(timeouts), testutil.ToFloat64(requests)

	next := newHolder()
	a := newRequest(context.Background(), `{}`).start(h, next)
	next.waitEntered(t)
	assert.Equal(t, g0+1, testutil.ToFloat64(grants), "the handler's engine reports to the observer")
	assert.Equal(t, 1.0, value("permits"))
	assert.Equal(t, 1.0, value("node_in_flight"))
	assert.Equal(t, 0.0, value("node_waiting"))
	assert.Equal(t, 1.0, value("store_up"))

	b := newRequest(context.Background(), `{}`).start(h, next)
	require.Eventually(t, func() bool { return value("node_waiting") == 1 }, 5*time.Second, 10*time.Millisecond)
	// A heartbeat (every lease/3) brings
	// the cluster's view.
	require.Eventually(t, func() bool {
		v, ok := gauge(t, reg, "caddy_fair_queue_cluster_nodes", name)
		return ok && v == 1
	}, 5*time.Second, 20*time.Millisecond)
	assert.Equal(t, 1.0, value("cluster_in_flight"))

	b.wait(t) // times out
	assert.Equal(t, r0+1, testutil.ToFloat64(timeouts))
	assert.Equal(t, q0+1, testutil.ToFloat64(requests))

	next.release <- struct{}{}
	a.wait(t)
	assert.Equal(t, 0.0, value("node_in_flight"))
	assert.Equal(t, 1.0, value("cluster_nodes"), "an idle instance still counts among the live ones")
	require.Eventually(t, func() bool { return value("cluster_in_flight") == 0 }, 5*time.Second, 20*time.Millisecond,
		"an idle node's view follows the store: it heartbeats too")

	require.NoError(t, h.Cleanup())
	poolEmpty(t)
	_, ok := gauge(t, reg, "caddy_fair_queue_permits", name)
	assert.False(t, ok, "a closed queue has no gauges")
}
