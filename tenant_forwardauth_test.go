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
	"github.com/caddyserver/caddy/v2/caddyconfig"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
)

// The tenant of docs/hostile-clients.md's forward_auth example is the
// one the auth service names, never one the client sends: copy_headers
// deletes the client's X-Tenant-Id before copying the service's, and
// where the service answers 2xx naming none, the request is the empty
// tenant, not the one the client chose. A request the service refuses
// never reaches the queue.
func TestTheTenantOfForwardAuthIsTheAuthServicesNotTheClients(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	auth := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.Header.Get("Authorization") {
		case "Bearer alice":
			w.Header().Set("X-Tenant-Id", "alice")
		case "Bearer anonymous": // 2xx, naming no tenant
		default:
			w.WriteHeader(http.StatusUnauthorized)
		}
	}))
	t.Cleanup(auth.Close)
	var mu sync.Mutex
	seen := map[string]string{} // tag -> the tenant key fair_queue resolved
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		mu.Lock()
		seen[r.Header.Get("X-Tag")] = r.Header.Get("X-Fq-Tenant")
		mu.Unlock()
		_, _ = io.WriteString(w, `{"choices":[]}`)
	}))
	t.Cleanup(upstream.Close)
	port := freePort(t)
	caddyfile := fmt.Sprintf(`{
	admin off
	auto_https off
}
:%d {
	route {
		forward_auth %s {
			uri /verify
			copy_headers X-Tenant-Id
		}
		fair_queue {
			name forward-auth-tenant
			permits 8
			tenant {http.request.header.X-Tenant-Id}
			max_in_flight_per_tenant 2
		}
		reverse_proxy %s {
			header_up X-Fq-Tenant {http.fair_queue.tenant}
		}
	}
}`, port, strings.TrimPrefix(auth.URL, "http://"), strings.TrimPrefix(upstream.URL, "http://"))
	cfg, _, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(caddyfile), nil)
	require.NoError(t, err)
	require.NoError(t, caddy.Load(cfg, false))
	t.Cleanup(func() { _ = caddy.Stop() })

	send := func(tag, authorization string) int {
		t.Helper()
		req, err := http.NewRequest(http.MethodPost, fmt.Sprintf("http://127.0.0.1:%d/v1/chat/completions", port),
			strings.NewReader(`{"model":"m","messages":[]}`))
		require.NoError(t, err)
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Authorization", authorization)
		req.Header.Set("X-Tenant-Id", "victim") // the client's choice, never the tenant
		req.Header.Set("X-Tag", tag)
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode
	}
	assert.Equal(t, http.StatusOK, send("alice", "Bearer alice"))
	assert.Equal(t, http.StatusOK, send("anonymous", "Bearer anonymous"))
	assert.Equal(t, http.StatusUnauthorized, send("refused", "Bearer nobody"))
	mu.Lock()
	defer mu.Unlock()
	assert.Equal(t, map[string]string{
		"alice":     fairqueue.TenantKey("alice"),
		"anonymous": fairqueue.TenantKey(""),
	}, seen, "the tenant of each request that reached the upstream")
	assert.NotEqual(t, fairqueue.TenantKey("victim"), fairqueue.TenantKey(""))
}
