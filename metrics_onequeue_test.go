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

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
	"github.com/fair-queue/caddy-fair-queue/internal/redistest"
)

// queueGaugeValues returns the gauges of queue in reg whose name starts
// with caddy_fair_queue_kv or caddy_fair_queue_upstream, by the name
// without caddy_fair_queue_ and, for an upstream's, its upstream label.
func queueGaugeValues(t *testing.T, reg prometheus.Gatherer, queue string) map[string]float64 {
	t.Helper()
	families, err := reg.Gather()
	require.NoError(t, err)
	got := map[string]float64{}
	for _, f := range families {
		name := strings.TrimPrefix(f.GetName(), "caddy_fair_queue_")
		if !strings.HasPrefix(name, "kv_tokens") && !strings.HasPrefix(name, "upstream_") || f.GetMetric()[0].GetGauge() == nil {
			continue
		}
		for _, m := range f.GetMetric() {
			key, ours := name, false
			for _, l := range m.GetLabel() {
				switch l.GetName() {
				case "queue":
					ours = l.GetValue() == queue
				case "upstream":
					key += " " + l.GetValue()
				}
			}
			if ours {
				got[key] = m.GetGauge().GetValue()
			}
		}
	}
	return got
}

// One queue on two Redis clients (two handlers whose redis blocks differ
// in a client option only: two engines of one queue, see
// TestOneQueueOnTwoRedisClientsIsReportedOnce) is one queue in the token
// and pool gauges too: its kv_tokens and each upstream's permits count
// once, and what the store reports (tokens held, permits held on an
// upstream) is not read twice.
func TestOneQueueOnTwoRedisClientsHasItsTokenAndPoolGaugesOnce(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	rds := redistest.Start(t)
	ctx := newContext(t)
	const name = "dup-clients-pool"
	handler := func(redis *RedisConfig) *Handler {
		return &Handler{Name: name, KVTokens: 1000, MaxWait: caddy.Duration(time.Minute), Redis: redis,
			Upstreams: []fairqueue.Upstream{{Dial: "a:1", Permits: 2, KVTokens: 500}, {Dial: "b:1", Permits: 2, KVTokens: 500}}}
	}
	a := provision(t, ctx, "", handler(&RedisConfig{Addresses: []string{rds.Addr()}}))
	b := provision(t, ctx, "", handler(&RedisConfig{Addresses: []string{rds.Addr()}, DialTimeout: caddy.Duration(time.Second)}))
	next := newHolder()
	ra := poolRequest(context.Background()).start(a, next)
	next.waitEntered(t)
	rb := poolRequest(context.Background()).start(b, next)
	next.waitEntered(t)
	t.Cleanup(func() {
		next.release <- struct{}{}
		next.release <- struct{}{}
		ra.wait(t)
		rb.wait(t)
	})

	snap, err := engineOf(t, a).q.Inspect(context.Background(), 0, 0)
	require.NoError(t, err)
	require.Positive(t, snap.TokensHeld, "the two requests hold tokens")
	reg := ctx.GetMetricsRegistry()
	var got map[string]float64
	require.Eventually(t, func() bool { // the tokens held come with both engines' heartbeats
		got = queueGaugeValues(t, reg, name)
		return got["kv_tokens_held"] >= float64(snap.TokensHeld)
	}, 30*time.Second, 20*time.Millisecond)
	assert.Equal(t, map[string]float64{
		"kv_tokens_capacity":              1000,
		"kv_tokens_held":                  float64(snap.TokensHeld),
		"upstream_permits a:1":            2,
		"upstream_permits b:1":            2,
		"upstream_kv_tokens_capacity a:1": 500,
		"upstream_kv_tokens_capacity b:1": 500,
		"upstream_in_flight a:1":          got["upstream_in_flight a:1"],
		"upstream_in_flight b:1":          got["upstream_in_flight b:1"],
		"upstream_kv_tokens_held a:1":     got["upstream_kv_tokens_held a:1"],
		"upstream_kv_tokens_held b:1":     got["upstream_kv_tokens_held b:1"],
		"upstream_cooling a:1":            0,
		"upstream_cooling b:1":            0,
	}, got, "one queue, as configured here, and the store's view once")
	assert.Equal(t, 2.0, got["upstream_in_flight a:1"]+got["upstream_in_flight b:1"], "two permits are held on the pool")
	assert.Equal(t, float64(snap.TokensHeld), got["upstream_kv_tokens_held a:1"]+got["upstream_kv_tokens_held b:1"],
		"the tokens held on the pool are the store's")
}
