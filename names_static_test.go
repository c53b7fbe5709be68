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

	"github.com/fair-queue/caddy-fair-queue/internal/mockllm"
)

// The 200-byte bound on queue names is on names resolved from the
// request (client input). A fixed name is the operator's, whatever its
// length: a config that names its queue so loads and serves, rather than
// loading and then answering every request 429 queue_full.
func TestAFixedQueueNameLongerThanTheBoundOnRequestNamesIsServed(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	mock := mockllm.New(mockllm.Config{Delay: -1})
	up := httptest.NewServer(mock.Handler())
	t.Cleanup(up.Close)
	name := strings.Repeat("q", maxQueueNameLen+1)
	port := freePort(t)
	config := fmt.Sprintf(`{"admin":{"disabled":true},"apps":{"http":{"servers":{"s":{"listen":["127.0.0.1:%d"],"routes":[{"handle":[
		{"handler":"fair_queue","name":%q,"permits":1,"max_wait":"5s"},
		{"handler":"reverse_proxy","upstreams":[{"dial":%q}]}]}]}}}}}`, port, name, strings.TrimPrefix(up.URL, "http://"))
	require.NoError(t, caddy.Load([]byte(config), false))
	t.Cleanup(func() { _ = caddy.Stop() })

	resp, err := http.Post(fmt.Sprintf("http://127.0.0.1:%d/v1/chat/completions", port), "application/json",
		strings.NewReader(`{"model":"m","messages":[{"role":"user","content":"hi"}]}`))
	require.NoError(t, err)
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	assert.Equal(t, http.StatusOK, resp.StatusCode, "reason %q: %s", resp.Header.Get("Fair-Queue-Reason"), body)
	assert.Equal(t, 1, mock.Served(), "the request reached the upstream")
}
