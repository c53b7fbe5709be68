package caddyfairqueue

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/internal/redistest"
)

// A queue whose clients never stream learns from refusals
// (docs/adaptive.md): each 429/503 brings its capacity down, and once the
// backend answers again while requests wait, the capacity must climb
// back, as AIMD does after a loss. Else every refusal it ever saw
// ratchets it down for good, to its floor, until every instance stops.
func TestAPlainQueueClimbsBackAfterRefusals(t *testing.T) {
	rds := redistest.Start(t)
	for _, store := range []string{"local", "redis"} {
		t.Run(store, func(t *testing.T) {
			t.Cleanup(func() { poolEmpty(t) })
			var refusing atomic.Bool
			refusing.Store(true)
			upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				_, _ = io.Copy(io.Discard, r.Body)
				w.Header().Set("Content-Type", "application/json")
				if refusing.Load() {
					w.WriteHeader(http.StatusTooManyRequests)
					_, _ = io.WriteString(w, `{"error":{"message":"busy"}}`)
					return
				}
				time.Sleep(50 * time.Millisecond)
				_, _ = io.WriteString(w, `{"choices":[{"message":{"content":"hi"}}]}`)
			}))
			t.Cleanup(upstream.Close)
			redis := ""
			if store == "redis" {
				redis = fmt.Sprintf(`"redis":{"addresses":[%q]},`, rds.Addr())
			}
			name := "adapt-plain-climbs-" + store
			port := freePort(t)
			config := fmt.Sprintf(`{"admin":{"disabled":true},"logging":{"logs":{"default":{"level":"ERROR"}}},
		"apps":{"http":{"servers":{"s":{"listen":["127.0.0.1:%d"],"routes":[{"handle":[
		{"handler":"fair_queue","name":%q,"permits":8,"max_wait":"60s",%s
		 "adaptive":{"target_ttft":"1s","min_samples":2,"interval":"100ms","decrease":0.5,"step":0.25}},
		{"handler":"reverse_proxy","upstreams":[{"dial":%q}]}]}]}}}}}`,
				port, name, redis, strings.TrimPrefix(upstream.URL, "http://"))
			require.NoError(t, caddy.Load([]byte(config), false))
			t.Cleanup(func() { _ = caddy.Stop() })
			url := fmt.Sprintf("http://127.0.0.1:%d/v1/chat/completions", port)

			// Plain requests, more than the capacity: they wait.
			ctx, cancel := context.WithCancel(context.Background())
			var wg sync.WaitGroup
			for range 12 {
				wg.Go(func() {
					for ctx.Err() == nil {
						req, _ := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(`{"model":"m","stream":false}`))
						req.Header.Set("Content-Type", "application/json")
						if resp, err := http.DefaultClient.Do(req); err == nil {
							_, _ = io.Copy(io.Discard, resp.Body)
							_ = resp.Body.Close()
						}
					}
				})
			}
			defer func() { cancel(); wg.Wait() }()

			require.Eventually(t, func() bool { return learnedShare(t, name) <= 0.25 }, 10*time.Second, 20*time.Millisecond,
				"the backend refuses every request, and the capacity stays at %v", learnedShare(t, name))
			refusing.Store(false)
			require.Eventually(t, func() bool { return learnedShare(t, name) >= 0.75 }, 20*time.Second, 20*time.Millisecond,
				"the backend answers every request again while requests wait, and the capacity stays at %v", learnedShare(t, name))
		})
	}
}
