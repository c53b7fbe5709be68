package integration

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/internal/harness"
	"github.com/fair-queue/caddy-fair-queue/internal/mockllm"
	"github.com/fair-queue/caddy-fair-queue/internal/redistest"
)

// A client that disconnects while queued must leave the queue at once,
// not hold its place (and later a permit) until max_wait. Go's HTTP/1.1
// server notices the disconnect only once the request body was read, so
// this is checked with a small body and with a large one.
func TestDisconnectWhileQueuedLeavesAtOnce(t *testing.T) {
	rds := redistest.Start(t)
	mock, upstream := harness.StartMockLLM(t, mockllm.Config{Tokens: 2})
	c := harness.StartCaddy(t, "caddy", proxySite(upstream, fmt.Sprintf(`
	fair_queue {
		permits 1
		max_wait 60s
		redis {
			url redis://%s/0
		}
	}`, rds.Addr())), harness.CaddyOptions{})
	client := newClient(t)
	q := Queue{rdb: rds.Client(t), name: "default"}

	for _, tc := range []struct {
		name        string
		promptBytes int
	}{
		{"small prompt", 100},
		{"1 MiB prompt", 1 << 20},
	} {
		t.Run(tc.name, func(t *testing.T) {
			mock.Reset()
			holder := holdPermit(t, client, c.URL(), nil)

			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			gone := sendAsync(ctx, client, c.URL(), Chat{Stream: true, Seq: "gone", PromptBytes: tc.promptBytes})
			// Queued means the handler has read the whole body.
			q.awaitWaiting(t, 1, 10*time.Second)
			cancel()
			left := time.Now()
			r := await(t, gone, 10*time.Second)
			require.True(t, errors.Is(r.Err, context.Canceled), "client result: %s", r)
			if !eventually(2*time.Second, func() bool { return q.Waiting(t) == 0 }) {
				t.Fatalf("ticket still waiting %v after its client left", time.Since(left))
			}

			// With the permit free again, a new client is served at once,
			// and the departed one never reaches the upstream.
			holder.Release()
			r = send(context.Background(), client, c.URL(), Chat{Stream: true, Seq: "next"})
			requireFullStream(t, r, 2)
			assert.Equal(t, []string{"next"}, mock.Arrivals(), "requests that reached the upstream")
			assert.Equal(t, 1, mock.Served())
			assert.Zero(t, q.Waiting(t))
			// The permit goes back once the handler returns, just after
			// the client has read the last byte.
			assert.True(t, eventually(5*time.Second, func() bool { return q.Holders(t) == 0 }),
				"a permit still held 5 s after the last request ended")
		})
	}
}
