package caddyfairqueue

import (
	"context"
	"net/http"
	"testing"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
)

// An operator keeps a tenant's API key out of the Caddyfile with an
// environment placeholder, as the Redis password takes one:
// `weight {env.GOLD_KEY} 4`. The placeholder was never replaced: the
// weight was for a tenant literally named "{env.GOLD_KEY}", no request
// matched it, and the gold tenant was served at weight 1, alternating
// with the others, without a word. With weight 4 against 1 it takes 4 of
// the first 5 grants (equal weights alternate: at most 3).
func TestWeightTenantTakesEnvironmentPlaceholders(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	t.Setenv("FQ_TEST_GOLD_KEY", "Bearer sk-live-gold")
	h, err := parse(`fair_queue {
		name env-weight
		permits 1
		tenant {http.request.header.Authorization}
		weight {env.FQ_TEST_GOLD_KEY} 4
	}`)
	require.NoError(t, err)
	provisionLocal(t, newContext(t), h)
	assert.Equal(t, 4, goldGrants(t, h), "grants after the holder: the gold tenant's of 5")
}

// The tenant's key, the form the docs recommend, takes a placeholder
// too, as its value does: `weight sha256:{env.GOLD_TENANT_KEY} 4` (a key
// that differs per deployment) was refused at load, its "key" the
// placeholder's text and not 16 hex digits, in the Caddyfile and in
// JSON, though placeholders in "a weight's tenant (value or sha256:
// key)" are replaced at load.
func TestWeightTenantKeyTakesEnvironmentPlaceholders(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	t.Setenv("FQ_TEST_GOLD_TENANT_KEY", fairqueue.TenantKey("Bearer sk-live-gold"))
	h, err := parse(`fair_queue {
		name env-weight-key
		permits 1
		tenant {http.request.header.Authorization}
		weight sha256:{env.FQ_TEST_GOLD_TENANT_KEY} 4
	}`)
	require.NoError(t, err)
	provisionLocal(t, newContext(t), h)
	assert.Equal(t, 4, goldGrants(t, h), "grants after the holder: the gold tenant's of 5")

	require.NoError(t, loadHandlerJSON(t, `"name":"env-weight-key-json","permits":1,"tenant":"{http.request.header.Authorization}",`+
		`"weights":{"sha256:{env.FQ_TEST_GOLD_TENANT_KEY}":4}`))
	err = loadHandlerJSON(t, `"name":"env-weight-key-bad","permits":1,"tenant":"{http.request.header.Authorization}",`+
		`"weights":{"sha256:{env.FQ_TEST_GOLD_TENANT}":4}`)
	require.Error(t, err, "a key that is no key once replaced")
	assert.Contains(t, err.Error(), "16 lowercase hex digits")
}

// goldGrants holds h's one permit, queues 8 requests alternating the
// tenants "Bearer sk-live-gold" and "Bearer other", and counts the gold
// tenant's among the first 5 granted after the holder: 4 with weight 4
// against 1 (equal weights alternate: at most 3).
func goldGrants(t *testing.T, h *Handler) int {
	t.Helper()
	next := newHolder()
	served := make(chan string, 20)
	seq := caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
		defer func() { served <- r.Header.Get("Authorization") }()
		return next.ServeHTTP(w, r)
	})
	first := newRequest(context.Background(), `{}`, "Authorization", "Bearer hold").start(h, seq)
	next.waitEntered(t)
	var waiting []*request
	for i := range 8 {
		tenant := []string{"Bearer sk-live-gold", "Bearer other"}[i%2]
		waiting = append(waiting, newRequest(context.Background(), `{}`, "Authorization", tenant).start(h, seq))
		waitingIn(t, h, i+1)
	}
	var order []string
	for i := range 6 {
		next.release <- struct{}{}
		order = append(order, <-served)
		if i < 5 {
			next.waitEntered(t)
		}
	}
	assert.Equal(t, "Bearer hold", order[0], "the holder first")
	gold := 0
	for _, tenant := range order[1:] {
		if tenant == "Bearer sk-live-gold" {
			gold++
		}
	}
	t.Logf("grants after the holder: %v", order[1:])
	for range 3 {
		next.waitEntered(t)
		next.release <- struct{}{}
	}
	first.wait(t)
	for _, r := range waiting {
		r.wait(t)
	}
	return gold
}

// A weight's tenant that is empty once replaced (the variable unset) is
// refused at load, without showing it.
func TestWeightTenantEmptyOnceReplacedIsRefused(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	err := loadHandlerJSON(t, `"permits":1,"tenant":"{http.request.header.Authorization}","weights":{"{env.FQ_TEST_UNSET_GOLD_KEY}":2}`)
	require.Error(t, err)
	assert.Contains(t, err.Error(), `weights["{env.FQ_TEST_UNSET_GOLD_KEY}"]: the tenant is empty once its placeholders are replaced`)
}
