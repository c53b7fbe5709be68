package caddyfairqueue

import (
	"context"
	"net/http"
	"testing"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
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
	gold := 0
	for _, tenant := range order[1:] {
		if tenant == "Bearer sk-live-gold" {
			gold++
		}
	}
	assert.Equal(t, 4, gold, "grants after the holder: %v", order[1:])
	for range 3 {
		next.waitEntered(t)
		next.release <- struct{}{}
	}
	first.wait(t)
	for _, r := range waiting {
		r.wait(t)
	}
}

// A weight's tenant that is empty once replaced (the variable unset) is
// refused at load, without showing it.
func TestWeightTenantEmptyOnceReplacedIsRefused(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	err := loadHandlerJSON(t, `"permits":1,"tenant":"{http.request.header.Authorization}","weights":{"{env.FQ_TEST_UNSET_GOLD_KEY}":2}`)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "weight: a tenant is empty once its placeholders are replaced")
}
