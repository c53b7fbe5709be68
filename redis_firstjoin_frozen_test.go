package caddyfairqueue

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
	"github.com/fair-queue/caddy-fair-queue/internal/redistest"
)

// firstJoinBound is how long the first request of an instance may wait
// on a frozen Redis, by docs/failures.md: the join, bounded by the
// store's timeout (fairqueue.DefaultStoreTimeout), with a margin for a
// loaded machine. A request held until an outage ends would be far past
// it: the test keeps Redis frozen for ten times as long.
const firstJoinBound = fairqueue.DefaultStoreTimeout + 3*time.Second

// docs/failures.md, "When Redis fails": the first request of an instance
// waits for the join, "bounded by the store's timeout (1 s) rather than
// its own max_wait, which matters for a max_wait under a second", and is
// then answered by on_store_error; the requests after it are answered
// alike, and none reaches the upstream. Through Caddy, with a max_wait
// of 200ms and Redis frozen (SIGSTOP) before the instance's first
// request: each client gets the documented 503 store_unavailable (a JSON
// error with its code and a Retry-After), the first within the store's
// timeout, not held for the outage; once Redis thaws the queue serves.
func TestFirstRequestOnAFrozenRedisWaitsForTheJoinAtMostTheStoreTimeout(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	rds := redistest.Start(t)
	var arrivals atomic.Int32
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		arrivals.Add(1)
		_, _ = io.WriteString(w, `{"ok":true}`)
	}))
	t.Cleanup(upstream.Close)

	port := freePort(t)
	config := fmt.Sprintf(`{"admin":{"disabled":true},"logging":{"logs":{"default":{"level":"ERROR"}}},
	"apps":{"http":{"servers":{"s":{"listen":["127.0.0.1:%d"],"routes":[{"handle":[
	{"handler":"fair_queue","name":"firstjoin","permits":1,"max_wait":"200ms","on_store_error":"fail_closed",
	 "redis":{"addresses":[%q]}},
	{"handler":"reverse_proxy","upstreams":[{"dial":%q}]}]}]}}}}}`,
		port, rds.Addr(), strings.TrimPrefix(upstream.URL, "http://"))
	require.NoError(t, caddy.Load([]byte(config), false))
	t.Cleanup(func() { _ = caddy.Stop() })

	rds.Freeze()
	thawed := false
	t.Cleanup(func() {
		if !thawed {
			rds.Thaw()
		}
	})
	frozeAt := time.Now()
	client := &http.Client{Timeout: 10 * firstJoinBound}
	post := func() (*http.Response, string, time.Duration) {
		start := time.Now()
		resp, err := client.Post(fmt.Sprintf("http://127.0.0.1:%d/v1/chat/completions", port),
			"application/json", strings.NewReader(`{"messages":[]}`))
		require.NoError(t, err)
		body, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		_ = resp.Body.Close()
		return resp, string(body), time.Since(start)
	}
	for i, what := range []string{"the instance's first request (it joins)", "the request after it"} {
		resp, body, took := post()
		t.Logf("%s on a frozen Redis: %d %q after %v", what, resp.StatusCode, resp.Header.Get("Fair-Queue-Reason"), took)
		assert.Less(t, took, firstJoinBound, "%s: held past the store's timeout", what)
		assert.Equal(t, http.StatusServiceUnavailable, resp.StatusCode, "%s: %s", what, body)
		assert.Equal(t, "store_unavailable", resp.Header.Get("Fair-Queue-Reason"), what)
		assert.NotEmpty(t, resp.Header.Get("Retry-After"), what)
		var e struct {
			Error struct{ Code string } `json:"error"`
		}
		require.NoError(t, json.Unmarshal([]byte(body), &e), "%s: body %q", what, body)
		assert.Equal(t, "store_unavailable", e.Error.Code, "%s: body %q", what, body)
		assert.Zero(t, arrivals.Load(), "%s reached the upstream (request %d)", what, i)
	}
	// Redis stayed frozen all along: the answers did not wait for it.
	require.Less(t, time.Since(frozeAt), 10*firstJoinBound)

	rds.Thaw()
	thawed = true
	require.Eventually(t, func() bool {
		resp, _, _ := post()
		return resp.StatusCode == http.StatusOK && resp.Header.Get("Fair-Queue-Reason") == ""
	}, 30*time.Second, 100*time.Millisecond, "the queue serves once Redis thaws")
	assert.Equal(t, int32(1), arrivals.Load())
}
