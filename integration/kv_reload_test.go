package integration

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/internal/harness"
	"github.com/fair-queue/caddy-fair-queue/internal/mockllm"
	"github.com/fair-queue/caddy-fair-queue/internal/redistest"
)

// A reload that moves a queue with kv_tokens from the local store to
// Redis while requests run and wait: the new queue counts the tokens of
// the old one's running requests against its capacity until they end,
// so the upstream never holds more than kv_tokens, and every request is
// served.
func TestReloadThatSwitchesTheStoreNeverDoublesTheTokens(t *testing.T) {
	rds := redistest.Start(t)
	const capacity = 1000
	g, _, upstream := startGauged(t, mockllm.Config{Tokens: 4, Delay: 100 * time.Millisecond})
	site := func(store string) string {
		return proxySite(upstream, fmt.Sprintf(`
	fair_queue {
		name llm
		kv_tokens %d
		max_wait 60s
		%s
	}`, capacity, store))
	}
	c := harness.StartCaddy(t, "caddy", site(""), harness.CaddyOptions{GracePeriod: 30 * time.Second})
	client := newClient(t)
	var results []<-chan Result
	send := func(seq string, acrossSwap bool) {
		k := kvChat{seq: seq, text: 400, maxTokens: 200} // 300: three fit
		out := make(chan Result, 1)
		go func() {
			r := k.send(context.Background(), client, c.URL())
			if acrossSwap && r.Status == 0 && r.Err != nil && (strings.Contains(r.Err.Error(), "connection reset") || errors.Is(r.Err, io.EOF)) {
				r = k.send(context.Background(), client, c.URL()) // the listener swap's, not the queue's
			}
			out <- r
		}()
		results = append(results, out)
	}
	for i := range 10 {
		send(fmt.Sprintf("c%d", i), false)
	}
	require.True(t, eventually(10*time.Second, func() bool { return localStats(t, c, "llm").Waiting >= 5 }),
		"clients not queued: %+v", localStats(t, c, "llm"))
	require.NoError(t, c.Load(site(fmt.Sprintf("redis {\n\t\t\turl redis://%s/0\n\t\t}", rds.Addr()))))
	for i := range 4 {
		send(fmt.Sprintf("n%d", i), true)
	}
	for i, ch := range results {
		r := await(t, ch, 2*time.Minute)
		require.Equal(t, http.StatusOK, r.Status, "client %d: %s", i, r)
	}
	assert.LessOrEqual(t, g.peakHeld(), capacity, "the tokens the upstream held at once")
	assert.Len(t, g.arrivals(), 14)
}
