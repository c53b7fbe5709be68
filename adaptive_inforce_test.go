package caddyfairqueue

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
)

// A queue's share, learned without a pool, stays in the store when a
// reload gives the queue a pool, but is no longer in force: each upstream
// learns its own (docs/adaptive.md), and the queue's permits are not
// scaled by it. The admin API and caddy_fair_queue_capacity_share ("no
// pool", docs/operations.md) must not show it as the capacity in force:
// an operator reading 0.9 there looks for a slowdown that is not.
func TestAQueueShareLeftByAReloadToAPoolIsNotShownInForce(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	const name = "share-then-pool"
	next, dial := refusingUpstream(t)
	adaptive := &AdaptiveConfig{TargetTTFT: caddy.Duration(time.Second), MinSamples: 1, Interval: caddy.Duration(100 * time.Millisecond)}
	old := provisionLocal(t, newContext(t), &Handler{Name: name, Permits: 4, MaxWait: caddy.Duration(5 * time.Second), Adaptive: adaptive})
	resp := serve(t, old, next).post(t, context.Background(), `{}`)
	_, _ = io.Copy(io.Discard, resp.Body)
	require.Equal(t, http.StatusTooManyRequests, resp.StatusCode)
	q := engineOf(t, old).q
	require.Eventually(t, func() bool { s, ok := q.Shares()[""]; return ok && s < 1 }, 5*time.Second, 10*time.Millisecond,
		"the upstream's 429 did not bring the share down: %v", q.Shares())

	ctx := newContext(t)
	updated := provisionLocal(t, ctx, &Handler{Name: name, Upstreams: []fairqueue.Upstream{{Dial: dial, Permits: 4}},
		MaxWait: caddy.Duration(5 * time.Second), Adaptive: adaptive})
	require.NoError(t, old.Cleanup())
	require.Same(t, q, engineOf(t, updated).q, "one engine across the reload")
	resp = serve(t, updated, next).post(t, context.Background(), `{}`) // applies the new settings
	_, _ = io.Copy(io.Discard, resp.Body)
	require.Len(t, q.Config().Upstreams, 1, "the pool in force")

	v, ok := gauge(t, ctx.GetMetricsRegistry(), "caddy_fair_queue_capacity_share", name)
	assert.False(t, ok, "capacity_share %v shown for a queue with a pool", v)
	rec, err := getStatus(t, http.MethodGet, "/fair_queue/")
	require.NoError(t, err)
	var rep struct {
		Queues []struct {
			Snapshot struct {
				LearnedShare *float64 `json:"learned_share"`
			} `json:"snapshot"`
		} `json:"queues"`
	}
	require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &rep))
	require.Len(t, rep.Queues, 1, rec.Body.String())
	assert.Nil(t, rep.Queues[0].Snapshot.LearnedShare, "the queue's old share shown in force: %s", rec.Body.String())
}

// A reload that turns adaptive off leaves the learned share in the store
// (a later reload turning it on again starts from it), but the queue runs
// all of its permits: the admin API must not show the share as in force.
func TestALearnedShareIsNotShownOnceAReloadTurnsAdaptiveOff(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	const name = "share-then-off"
	next, _ := refusingUpstream(t)
	old := provisionLocal(t, newContext(t), &Handler{Name: name, Permits: 4, MaxWait: caddy.Duration(5 * time.Second),
		Adaptive: &AdaptiveConfig{TargetTTFT: caddy.Duration(time.Second), MinSamples: 1, Interval: caddy.Duration(100 * time.Millisecond)}})
	resp := serve(t, old, next).post(t, context.Background(), `{}`)
	_, _ = io.Copy(io.Discard, resp.Body)
	q := engineOf(t, old).q
	require.Eventually(t, func() bool { s, ok := q.Shares()[""]; return ok && s < 1 }, 5*time.Second, 10*time.Millisecond,
		"the upstream's 429 did not bring the share down: %v", q.Shares())

	updated := provisionLocal(t, newContext(t), &Handler{Name: name, Permits: 4, MaxWait: caddy.Duration(5 * time.Second)})
	require.NoError(t, old.Cleanup())
	resp = serve(t, updated, next).post(t, context.Background(), `{}`) // applies the new settings
	_, _ = io.Copy(io.Discard, resp.Body)
	require.Nil(t, q.Config().Adaptive, "adaptive off in force")
	rec, err := getStatus(t, http.MethodGet, "/fair_queue/")
	require.NoError(t, err)
	var rep struct {
		Queues []struct {
			Snapshot struct {
				LearnedShare *float64 `json:"learned_share"`
			} `json:"snapshot"`
		} `json:"queues"`
	}
	require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &rep))
	require.Len(t, rep.Queues, 1, rec.Body.String())
	assert.Nil(t, rep.Queues[0].Snapshot.LearnedShare, "a share shown in force without adaptive: %s", rec.Body.String())
}
