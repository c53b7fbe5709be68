package caddyfairqueue

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/caddyserver/caddy/v2"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// runCaddy runs Caddy in this process with one server whose route has
// handlers (JSON objects, in order); it returns the server's URL.
func runCaddy(t *testing.T, handlers ...string) string {
	t.Helper()
	return runCaddyWith(t, "", handlers...)
}

// runCaddyWith is runCaddy with more fields of the server (JSON, each
// followed by a comma).
func runCaddyWith(t *testing.T, server string, handlers ...string) string {
	t.Helper()
	port := freePort(t)
	cfg := fmt.Sprintf(`{"admin":{"disabled":true},"logging":{"logs":{"default":{"level":"ERROR"}}},
	"apps":{"http":{"servers":{"s":{%s"listen":["127.0.0.1:%d"],"routes":[{"handle":[%s]}]}}}}}`, server, port, strings.Join(handlers, ","))
	require.NoError(t, caddy.Load([]byte(cfg), false))
	t.Cleanup(func() { _ = caddy.Stop() })
	return fmt.Sprintf("http://127.0.0.1:%d", port)
}

// A requeued request is sent again as it was first sent: the handlers
// between fair_queue and reverse_proxy (a rewrite, a request header)
// run again on the request as fair_queue passed it on, not on what they
// made of it the first time (the path prefixed twice, the header added
// twice).
func TestRequeueSendsTheRequestAsFairQueuePassedItOn(t *testing.T) {
	var mu sync.Mutex
	var paths, tags []string
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		mu.Lock()
		paths = append(paths, r.URL.Path)
		tags = append(tags, strings.Join(r.Header.Values("X-Tag"), ","))
		first := len(paths) == 1
		mu.Unlock()
		if first {
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		w.WriteHeader(http.StatusOK)
	}))
	t.Cleanup(upstream.Close)
	url := runCaddy(t,
		fmt.Sprintf(`{"handler":"fair_queue","name":"requeue-rewrite","upstreams":[{"dial":%q,"permits":1}],
			"requeue_on":[503],"upstream_cooldown":"10ms"}`, strings.TrimPrefix(upstream.URL, "http://")),
		`{"handler":"rewrite","uri":"/v1{http.request.uri.path}"}`,
		`{"handler":"headers","request":{"add":{"X-Tag":["pool"]}}}`,
		`{"handler":"reverse_proxy","dynamic_upstreams":{"source":"fair_queue"}}`)

	resp, err := http.Post(url+"/chat/completions", "application/json", strings.NewReader(`{"model":"m","messages":[]}`))
	require.NoError(t, err)
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	assert.Equal(t, http.StatusOK, resp.StatusCode, "the second answer")
	mu.Lock()
	defer mu.Unlock()
	assert.Equal(t, []string{"/v1/chat/completions", "/v1/chat/completions"}, paths, "rewritten once for each sending")
	assert.Equal(t, []string{"pool", "pool"}, tags, "the header added once for each sending")
}
