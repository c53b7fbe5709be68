package caddyfairqueue

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// counterOf returns the value of the counter name in reg whose labels
// are labels, and whether there is one.
func counterOf(t *testing.T, reg prometheus.Gatherer, name string, labels map[string]string) (float64, bool) {
	t.Helper()
	families, err := reg.Gather()
	require.NoError(t, err)
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
	metric:
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if v, ok := labels[l.GetName()]; ok && v != l.GetValue() {
					continue metric
				}
			}
			return m.GetCounter().GetValue(), true
		}
	}
	return 0, false
}

// The labels (overflow) and (unknown) stand for requests the handler
// refused without opening a queue. A client that names its queue so
// (the name is client input) must neither count its requests there nor,
// when its queue is given back and that name's series are deleted,
// delete the count of the handler's refusals.
func TestAClientCannotNameItsQueueAsAReservedLabel(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	setQueueIdle(t, 50*time.Millisecond)
	reg := prometheus.NewRegistry()
	registerMetrics(reg)
	h := provisionLocal(t, newContext(t), &Handler{Name: "{http.request.header.X-Queue}", Permits: 1,
		MaxWait: caddy.Duration(time.Minute)})
	refused := newRequest(context.Background(), `{}`, "X-Queue", strings.Repeat("n", maxQueueNameLen+1)).start(h, okHandler).wait(t)
	require.Equal(t, "queue_full", refused.placeholder(phOutcome))
	overflowRejects := map[string]string{"queue": overflowQueue, "reason": "queue_full"}
	before, ok := counterOf(t, reg, "caddy_fair_queue_rejects_total", overflowRejects)
	require.True(t, ok)

	for _, name := range []string{overflowQueue, unknownQueue} {
		req := newRequest(context.Background(), `{}`, "X-Queue", name).start(h, okHandler).wait(t)
		assert.NotEqual(t, "granted", req.placeholder(phOutcome), "%s is not a queue a client may open", name)
		_, ok := counterOf(t, reg, "caddy_fair_queue_requests_total", map[string]string{"queue": name, "outcome": "granted"})
		assert.False(t, ok, "a client's request counted as granted under %s", name)
	}
	noEngines(t, h) // every queue given back, its series deleted
	after, ok := counterOf(t, reg, "caddy_fair_queue_rejects_total", overflowRejects)
	assert.True(t, ok, "the count of refusals was deleted with a client's queue")
	assert.GreaterOrEqual(t, after, before)
}

// A name the handler refuses from a request cannot be listed in names
// either: the config saying so is refused at load.
func TestNamesCannotListAReservedLabel(t *testing.T) {
	for _, name := range []string{overflowQueue, unknownQueue} {
		err := checkNames([]string{"chat", name})
		require.Error(t, err, name)
		assert.Contains(t, err.Error(), name)
	}
	assert.NoError(t, checkNames([]string{"chat", "(other)"}))
}
