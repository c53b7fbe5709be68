package caddyfairqueue

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/internal/redistest"
)

// key_prefix takes a runtime placeholder, as the other redis options
// (url, address, username, password, master_name) do: an operator who
// runs staging and production on one Redis writes
// `key_prefix {env.DEPLOYMENT}`. It was not replaced: every deployment
// wrote its queues under the literal "{env.DEPLOYMENT}" prefix, one
// queue shared by them all, their permits counted together.
func TestRedisKeyPrefixReplacesItsPlaceholders(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	srv := redistest.Start(t)
	t.Setenv("FQ_TEST_DEPLOYMENT", "staging")
	// The upstream looks at Redis while the request holds its permit.
	rdb := srv.Client(t)
	seen := make(chan []string, 1)
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		keys, _ := rdb.Keys(r.Context(), "*").Result()
		seen <- keys
		_, _ = io.WriteString(w, "ok")
	}))
	t.Cleanup(upstream.Close)
	port := freePort(t)
	cfg := adapt(t, fmt.Sprintf(`{
	admin off
	log {
		level ERROR
	}
}

http://127.0.0.1:%d {
	fair_queue {
		name llm
		permits 1
		redis {
			address %s
			key_prefix {env.FQ_TEST_DEPLOYMENT}
		}
	}
	reverse_proxy %s
}
`, port, srv.Addr(), upstream.URL))
	require.NoError(t, caddy.Load([]byte(cfg), false))
	t.Cleanup(func() { _ = caddy.Stop() })

	resp, err := http.Post(fmt.Sprintf("http://127.0.0.1:%d/v1/chat/completions", port), "application/json",
		strings.NewReader(`{"model":"m","messages":[]}`))
	require.NoError(t, err)
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)

	keys := <-seen
	require.NotEmpty(t, keys, "the running request's permit is in Redis")
	for _, k := range keys {
		assert.True(t, strings.HasPrefix(k, "{staging:llm}") || strings.HasPrefix(k, "{staging}"), "key %q is not under the prefix the placeholder names", k)
	}
}
