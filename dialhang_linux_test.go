package caddyfairqueue

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/internal/redistest"
)

// A request granted on an upstream whose dial hangs learns it at
// reverse_proxy's dial_timeout; its max_wait over by then, it gets the
// timeout reject, with either store (docs/pools.md, Limits: max_wait
// bounds the wait for a permit, not the forwarding), and the upstream
// cools. Without Redis, its requeue was granted again at once on the
// other upstream, free, and the request was sent past its max_wait.
func TestARequestWhoseDialHangsPastItsMaxWaitGetsTheTimeoutReject(t *testing.T) {
	for _, store := range []string{"local", "redis"} {
		t.Run(store, func(t *testing.T) {
			t.Cleanup(func() { poolEmpty(t) })
			redis := ""
			if store == "redis" {
				redis = fmt.Sprintf(`,"redis":{"addresses":[%q]}`, redistest.Start(t).Addr())
			}
			hang := hangingAddr(t) // its dial hangs
			var served atomic.Int64
			live := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				_, _ = io.Copy(io.Discard, r.Body)
				served.Add(1)
			}))
			t.Cleanup(live.Close)
			name := "dialhang-" + store
			port := freePort(t)
			require.NoError(t, caddy.Load([]byte(fmt.Sprintf(`{"admin":{"disabled":true},"logging":{"logs":{"default":{"level":"ERROR"}}},
	"apps":{"http":{"servers":{"s":{"listen":["127.0.0.1:%d"],"routes":[{"handle":[
		{"handler":"fair_queue","name":%q,"upstreams":[{"dial":%q,"permits":1},{"dial":%q,"permits":1}],"requeue_on":[503],
		 "upstream_cooldown":"1m","max_wait":"500ms"%s},
		{"handler":"reverse_proxy","dynamic_upstreams":{"source":"fair_queue"},"transport":{"protocol":"http","dial_timeout":"1500ms"}}]}]}}}}}`,
				port, name, hang, strings.TrimPrefix(live.URL, "http://"), redis)), false))
			t.Cleanup(func() { _ = caddy.Stop() })
			url := fmt.Sprintf("http://127.0.0.1:%d/v1/chat/completions", port)
			cooled := metrics.cooldowns.WithLabelValues(name, hang)
			c0 := testutil.ToFloat64(cooled)

			// Ties go to the upstream granted longest ago: one of the
			// first two requests is granted on the hanging one.
			var code int
			var body string
			var took time.Duration
			for range 2 {
				start := time.Now()
				resp, err := http.Post(url, "application/json", strings.NewReader(`{"model":"m","messages":[]}`))
				require.NoError(t, err)
				b, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				code, body, took = resp.StatusCode, string(b), time.Since(start)
				if code != http.StatusOK {
					break
				}
			}
			require.Equal(t, http.StatusTooManyRequests, code, "the timeout reject: %s", body)
			assert.Contains(t, body, `"timeout"`)
			assert.GreaterOrEqual(t, took, 1500*time.Millisecond, "answered once the dial timed out")
			assert.Equal(t, c0+1, testutil.ToFloat64(cooled), "the upstream whose dial hung cools")
			assert.LessOrEqual(t, served.Load(), int64(1), "the request was sent again past its max_wait")
		})
	}
}
