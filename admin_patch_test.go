package caddyfairqueue

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"syscall"
	"testing"

	"github.com/caddyserver/caddy/v2"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/internal/redistest"
)

// adminCall sends method with body to path on Caddy's admin endpoint
// and returns the status and body of the answer. Each config load, even
// one refused, replaces Caddy's admin server and shuts the old one down
// in the background, which may close the next call's connection before
// it is answered (EOF, or reset): such a call, which reached no handler,
// is sent again on a new connection.
func adminCall(t *testing.T, admin, method, path, body string) (int, string) {
	t.Helper()
	var resp *http.Response
	for try := 1; ; try++ {
		req, err := http.NewRequest(method, "http://"+admin+path, strings.NewReader(body))
		require.NoError(t, err)
		req.Header.Set("Content-Type", "application/json")
		req.Close = true
		resp, err = http.DefaultClient.Do(req)
		if err == nil {
			break
		}
		require.True(t, try < 5 && (errors.Is(err, io.EOF) || errors.Is(err, syscall.ECONNRESET)), "%v", err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, string(b)
}

// An operator changes one option of a running queue through Caddy's
// admin API, as a reload: the waiters stay, the new value applies; a
// bad value is refused naming the option, and the config in force
// stays.
func TestAdminAPIPatchOfOneOptionActsAsAReload(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	up := newHeldUpstream(t)
	admin := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	// Port 0, not a freePort: see serverURL. Each reload listens on a
	// port of its own; a request sent after one goes to serverURL then.
	cfg := fmt.Sprintf(`{"admin":{"listen":%q},"logging":{"logs":{"default":{"level":"ERROR"}}},
		"apps":{"http":{"servers":{"s":{"listen":["127.0.0.1:0"],"routes":[{"handle":[
		{"handler":"fair_queue","name":"patched","permits":1,"max_wait":"30s"},%s]}]}}}}}`, admin, up.proxy())
	require.NoError(t, caddy.Load([]byte(cfg), false))
	t.Cleanup(func() {
		_ = caddy.Load([]byte(`{"admin":{"disabled":true}}`), false)
		_ = caddy.Stop()
	})
	url := serverURL(t, "s")
	const handler = "/config/apps/http/servers/s/routes/0/handle/0/"
	// A connection of its own for each request: a reload shuts the old
	// server down, closing an idle connection a request would reuse.
	fresh := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}

	first := chat(t.Context(), fresh, url, `{"n":1}`)
	up.nextBody(t)
	second := chat(t.Context(), fresh, url, `{"n":2}`)
	waitQueueWaiting(t, "patched", 1)

	for _, tc := range []struct{ field, value, want string }{
		{"permits", `0`, "permits must be at least 1"},
		{"permits", `"two"`, "permits: want an integer, got a string"},
		{"max_wait", `"10ms"`, "max_wait must be at least 50ms"},
		{"max_wait", `"soon"`, `max_wait: invalid duration "soon"`},
		{"max_wait", `-1000000000`, "max_wait must be positive"},
		{"kv_tokens", `-1`, "kv_tokens must be >= 0"},
	} {
		method := http.MethodPatch
		if tc.field == "kv_tokens" {
			method = http.MethodPut // absent: PUT adds it
		}
		code, body := adminCall(t, admin, method, handler+tc.field, tc.value)
		assert.NotEqual(t, http.StatusOK, code, "%s %s is refused", tc.field, tc.value)
		var e struct{ Error string }
		require.NoError(t, json.Unmarshal([]byte(body), &e), body)
		assert.Contains(t, e.Error, tc.want, "%s %s", tc.field, tc.value)
		assert.NotContains(t, e.Error, "caddyfairqueue.", "no Go type in the error")
	}
	code, body := adminCall(t, admin, http.MethodGet, handler+"permits", "")
	require.Equal(t, http.StatusOK, code)
	assert.Equal(t, "1", strings.TrimSpace(body), "the refused changes left the config in force")
	assert.Equal(t, 1, queueWaiting(t, "patched"), "the refused changes left the waiter")
	assert.Equal(t, url, serverURL(t, "s"), "the refused changes left the server")
	assert.EqualValues(t, 1, up.total.Load(), "one permit still in force")

	// New settings reach the queue with the new config's first request
	// (docs/operations.md, "Reload").
	code, body = adminCall(t, admin, http.MethodPatch, handler+"permits", `2`)
	require.Equal(t, http.StatusOK, code, body)
	third := chat(t.Context(), fresh, serverURL(t, "s"), `{"n":3}`)
	assert.Equal(t, `{"n":2}`, up.nextBody(t), "the waiter kept its place and is granted the new permit")
	waitQueueWaiting(t, "patched", 1)

	code, body = adminCall(t, admin, http.MethodPatch, handler+"max_wait", `200000000`)
	require.Equal(t, http.StatusOK, code, body, "a duration as nanoseconds")
	a := got(t, chat(t.Context(), fresh, serverURL(t, "s"), `{"n":4}`))
	assert.Equal(t, http.StatusTooManyRequests, a.status, "the new max_wait (200ms) applies to a new request: %s", a.body)
	assert.Contains(t, a.body, "timeout")
	assert.Equal(t, 1, queueWaiting(t, "patched"), "the waiter from before keeps its deadline")

	for range 3 {
		up.release <- struct{}{}
	}
	assert.Equal(t, http.StatusOK, got(t, first).status)
	assert.Equal(t, http.StatusOK, got(t, second).status)
	assert.Equal(t, http.StatusOK, got(t, third).status)
}

// kv_tokens changed through the admin API: a waiter that did not fit
// beside the running request is granted once the new capacity is in
// force, on either store.
func TestAdminAPIPatchOfKVTokensGrantsTheWaiterThatNowFits(t *testing.T) {
	for _, store := range []string{"local", "redis"} {
		t.Run(store, func(t *testing.T) {
			t.Cleanup(func() { poolEmpty(t) })
			redis := ""
			if store == "redis" {
				redis = fmt.Sprintf(`,"redis":{"addresses":[%q]}`, redistest.Start(t).Addr())
			}
			up := newHeldUpstream(t)
			admin := fmt.Sprintf("127.0.0.1:%d", freePort(t))
			// Port 0, not a freePort: see serverURL.
			cfg := fmt.Sprintf(`{"admin":{"listen":%q},"logging":{"logs":{"default":{"level":"ERROR"}}},
				"apps":{"http":{"servers":{"s":{"listen":["127.0.0.1:0"],"routes":[{"handle":[
				{"handler":"fair_queue","name":"patched-kv","permits":4,"kv_tokens":1000,"max_wait":"30s"%s},%s]}]}}}}}`,
				admin, redis, up.proxy())
			require.NoError(t, caddy.Load([]byte(cfg), false))
			t.Cleanup(func() {
				_ = caddy.Load([]byte(`{"admin":{"disabled":true}}`), false)
				_ = caddy.Stop()
			})
			url := serverURL(t, "s")
			const heavy = `{"messages":[{"role":"user","content":"hi"}],"max_tokens":600,"n":%d}`
			first := chat(t.Context(), http.DefaultClient, url, fmt.Sprintf(heavy, 1))
			up.nextBody(t)
			second := chat(t.Context(), http.DefaultClient, url, fmt.Sprintf(heavy, 2))
			waitQueueWaiting(t, "patched-kv", 1)

			code, body := adminCall(t, admin, http.MethodPatch, "/config/apps/http/servers/s/routes/0/handle/0/kv_tokens", `2000`)
			require.Equal(t, http.StatusOK, code, body)
			// The new config listens on a port of its own (serverURL):
			// the newcomer reaches the new config's handler, not the old
			// config's server, which still serves the first two.
			newURL := serverURL(t, "s")
			require.NotEqual(t, url, newURL)
			third := chat(t.Context(), http.DefaultClient, newURL, `{"messages":[{"role":"user","content":"hi"}],"max_tokens":10}`)
			// Both fit now: granted together, they reach the upstream in
			// either order (the waiter is woken, the newcomer answered).
			bodies := up.nextBody(t) + up.nextBody(t)
			assert.Contains(t, bodies, `"n":2`, "the waiter is kept and fits the new capacity")
			assert.Contains(t, bodies, `"max_tokens":10`)
			for range 3 {
				up.release <- struct{}{}
			}
			for _, ch := range []<-chan answer{first, second, third} {
				assert.Equal(t, http.StatusOK, got(t, ch).status)
			}
		})
	}
}
