package caddyfairqueue

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A browser reads a reject only with CORS headers (README, "Where
// fair_queue goes"): those that Caddy's headers handler sets before
// fair_queue reach the client on a reject too, for the POST and for a
// preflight that reached the queue.
func TestRejectKeepsTheCORSHeadersSetBeforeFairQueue(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	up := newHeldUpstream(t)
	url := runCaddy(t,
		`{"handler":"headers","response":{"set":{"Access-Control-Allow-Origin":["https://chat.example"]}}}`,
		`{"handler":"fair_queue","name":"cors","permits":1,"max_wait":"100ms"}`, up.proxy())
	running := chat(context.Background(), http.DefaultClient, url, `{"model":"m"}`)
	require.Eventually(t, func() bool { return up.run.Load() == 1 }, 10*time.Second, 5*time.Millisecond)

	for _, method := range []string{http.MethodPost, http.MethodOptions} {
		req, err := http.NewRequest(method, url+"/v1/chat/completions", strings.NewReader(`{"model":"m"}`))
		require.NoError(t, err)
		req.Header.Set("Origin", "https://chat.example")
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		assert.Equal(t, http.StatusTooManyRequests, resp.StatusCode, method)
		assert.Equal(t, "https://chat.example", resp.Header.Get("Access-Control-Allow-Origin"), method)
	}
	up.release <- struct{}{}
	assert.Equal(t, http.StatusOK, got(t, running).status)
}
