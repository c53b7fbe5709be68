package caddyfairqueue

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A requeue_on refusal whose body breaks off (the upstream closes the
// connection before its Content-Length, as a server going down does) is
// held back and requeued like any other: reverse_proxy aborts such an
// answer with a panic, which must not reach the client, who has seen
// nothing of the refusal.
func TestARefusalWhoseBodyBreaksOffIsRequeued(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	var calls atomic.Int32
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		if calls.Add(1) == 1 {
			w.Header().Set("Content-Length", "100")
			w.WriteHeader(http.StatusServiceUnavailable)
			_, _ = io.WriteString(w, `{"error":`)
			_ = http.NewResponseController(w).Flush()
			if conn, _, err := http.NewResponseController(w).Hijack(); err == nil {
				_ = conn.Close() // 91 bytes short
			}
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"answer":"ok"}`)
	}))
	t.Cleanup(up.Close)
	url := runCaddy(t,
		fmt.Sprintf(`{"handler":"fair_queue","name":"requeue-broken-body","upstreams":[{"dial":%q,"permits":1}],
			"requeue_on":[503],"upstream_cooldown":"10ms"}`, strings.TrimPrefix(up.URL, "http://")),
		`{"handler":"reverse_proxy","dynamic_upstreams":{"source":"fair_queue"}}`)

	resp, err := http.Post(url+"/v1/chat/completions", "application/json", strings.NewReader(`{"model":"m","messages":[]}`))
	require.NoError(t, err, "the client's connection was cut")
	body, err := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	require.NoError(t, err)
	assert.Equal(t, http.StatusOK, resp.StatusCode)
	assert.Equal(t, `{"answer":"ok"}`, string(body), "the answer of the second sending")
	assert.Equal(t, int32(2), calls.Load(), "sent again after the refusal")
}
