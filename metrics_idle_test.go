package caddyfairqueue

import (
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/internal/redistest"
)

// A queue named from the request leaves no series once it went idle and
// closed: names a client makes up do not grow /metrics for good.
func TestAnIdleQueueNamedFromTheRequestLeavesNoSeries(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	setQueueIdle(t, 2*time.Second)
	rds := redistest.Start(t)
	ctx := newContext(t)
	h := provision(t, ctx, rds.Addr(), &Handler{Name: "{http.fair_queue.model}", Permits: 1})
	for i := range 3 {
		require.Equal(t, http.StatusOK, model(t, h, "series-"+strconv.Itoa(i)).w.Code)
	}
	require.NotEmpty(t, seriesOf(t, ctx.GetMetricsRegistry(), "series-"), "the queues have series while open")
	noEngines(t, h)
	// The registry lets an engine go before its Destruct closes it (and
	// deletes its series): wait for the close, not only the release.
	var left []string
	assert.Eventually(t, func() bool { left = seriesOf(t, ctx.GetMetricsRegistry(), "series-"); return len(left) == 0 },
		10*time.Second, 5*time.Millisecond, "series of closed queues stay: %v", left)
}

// seriesOf lists the series in reg whose queue label starts with prefix.
func seriesOf(t *testing.T, reg prometheus.Gatherer, prefix string) []string {
	t.Helper()
	mfs, err := reg.Gather()
	require.NoError(t, err)
	var out []string
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "queue" && strings.HasPrefix(l.GetValue(), prefix) {
					out = append(out, mf.GetName()+"{queue="+l.GetValue()+"}")
				}
			}
		}
	}
	return out
}
