package caddyfairqueue

import (
	"context"
	"encoding/json"
	"net/http"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/internal/redistest"
)

// Two handlers of one config name one queue in one Redis, but their
// redis blocks differ in a client option only (here dial_timeout; a URL
// written as address, or another ACL user, does the same): each gets an
// engine of its own (storeID differs, dataID is the same). It is still
// one queue, with one permits setting, and the operator should see it
// once: in the admin API, and in the gauges.
func TestOneQueueOnTwoRedisClientsIsReportedOnce(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	rds := redistest.Start(t)
	ctx := newContext(t)
	const name = "dup-clients"
	a := provision(t, ctx, "", &Handler{Name: name, Permits: 3,
		Redis: &RedisConfig{Addresses: []string{rds.Addr()}}})
	b := provision(t, ctx, "", &Handler{Name: name, Permits: 3,
		Redis: &RedisConfig{Addresses: []string{rds.Addr()}, DialTimeout: caddy.Duration(time.Second)}})
	next := newHolder()
	ra := newRequest(context.Background(), `{}`).start(a, next)
	next.waitEntered(t)
	rb := newRequest(context.Background(), `{}`).start(b, next)
	next.waitEntered(t)
	t.Cleanup(func() {
		next.release <- struct{}{}
		next.release <- struct{}{}
		ra.wait(t)
		rb.wait(t)
	})

	reg := ctx.GetMetricsRegistry()
	permits, ok := gauge(t, reg, "caddy_fair_queue_permits", name)
	require.True(t, ok)
	assert.Equal(t, 3.0, permits, "permits of the queue, as configured here: 3, not the sum of its engines")
	require.Eventually(t, func() bool {
		v, ok := gauge(t, reg, "caddy_fair_queue_cluster_in_flight", name)
		return ok && v > 0
	}, 5*time.Second, 20*time.Millisecond)
	inFlight, _ := gauge(t, reg, "caddy_fair_queue_cluster_in_flight", name)
	assert.Equal(t, 2.0, inFlight, "two permits are held in the whole queue")

	rec, err := getStatus(t, http.MethodGet, "/fair_queue/")
	require.NoError(t, err)
	var rep statusReport
	require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &rep))
	assert.Len(t, rep.Queues, 1, "one queue, one row: %s", rec.Body.String())
}

// Two spellings of one Redis URL are the same settings: one client, one
// engine per queue. The identity hashed the URL's whole text, so
// redis://h:1 and redis://h:1/0 (db 0 either way) made two clients, two
// nodes of each queue, and (above) each queue reported twice.
func TestEquivalentRedisURLsShareOneClient(t *testing.T) {
	id := func(cfg *RedisConfig) string {
		t.Helper()
		b, err := newRedisBackend(cfg, caddy.NewReplacer())
		require.NoError(t, err)
		return b.storeID()
	}
	base := id(&RedisConfig{URL: "redis://h:1/0"})
	for _, cfg := range []*RedisConfig{
		{URL: "redis://h:1"},
		{URL: "redis://h:1/"},
		{URL: "redis://h:1/0", Password: "p"}, // the URL's password overridden
	} {
		if cfg.Password != "" {
			assert.Equal(t, id(&RedisConfig{URL: "redis://:other@h:1/0", Password: "p"}), id(cfg), "%+v", cfg)
			continue
		}
		assert.Equal(t, base, id(cfg), "%+v", cfg)
	}
	assert.NotEqual(t, base, id(&RedisConfig{URL: "redis://h:1/0?pool_size=3"}), "an option of the query is another client")
	assert.NotEqual(t, base, id(&RedisConfig{URL: "redis://h:1/1"}), "another db")
}
