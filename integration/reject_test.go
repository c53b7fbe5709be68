package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/internal/harness"
	"github.com/fair-queue/caddy-fair-queue/internal/mockllm"
	"github.com/fair-queue/caddy-fair-queue/internal/redistest"
)

func TestTimeoutRejects(t *testing.T) {
	rds := redistest.Start(t)
	mock, upstream := harness.StartMockLLM(t, mockllm.Config{})
	fairQueue := func(reject string) string {
		return proxySite(upstream, fmt.Sprintf(`
	fair_queue {
		permits 1
		max_wait 1s
		redis {
			url redis://%s/0
		}
		%s
	}`, rds.Addr(), reject))
	}
	c := harness.StartCaddy(t, "caddy", fairQueue(""), harness.CaddyOptions{})
	client := newClient(t)
	ctx := context.Background()
	holder := holdPermit(t, client, c.URL(), nil)
	q := Queue{rdb: rds.Client(t), name: "default"}

	t.Run("plain request gets 429 and a JSON error", func(t *testing.T) {
		start := time.Now()
		r := send(ctx, client, c.URL(), Chat{})
		waited := time.Since(start)
		e := requireJSONReject(t, r, http.StatusTooManyRequests, "timeout")
		assert.Equal(t, "rate_limit_exceeded", e.Error.Type)
		assert.GreaterOrEqual(t, waited, 900*time.Millisecond, "rejected before max_wait")
		assert.Less(t, waited, 5*time.Second, "rejected long after max_wait")
	})
	t.Run("streaming request gets an SSE error event", func(t *testing.T) {
		r := send(ctx, client, c.URL(), Chat{Stream: true})
		requireSSEReject(t, r, "timeout")
	})
	t.Run("Accept text/event-stream gets an SSE error event", func(t *testing.T) {
		r := send(ctx, client, c.URL(), Chat{Accept: "text/event-stream"})
		requireSSEReject(t, r, "timeout")
	})
	assert.Zero(t, q.Waiting(t), "timed-out tickets left waiting")
	assert.Equal(t, 1, mock.InFlight(), "only the holder reached the upstream")
	holder.Release()
	q.awaitHolders(t, 0, 10*time.Second)

	t.Run("custom reject after a reload", func(t *testing.T) {
		require.NoError(t, c.Load(fairQueue(`reject timeout {
			status 503
			retry_after 7s
			body `+"`"+`{"busy":true,"reason":"{http.fair_queue.reason}","queue":"{http.fair_queue.queue}"}`+"`"+`
			sse_event overloaded
		}`)))
		holder := holdPermitAcrossSwap(t, client, c.URL(), nil)
		defer holder.Release()

		r := send(ctx, client, c.URL(), Chat{})
		require.NoError(t, r.Err)
		require.Equal(t, http.StatusServiceUnavailable, r.Status, "%s", r)
		assert.Equal(t, "timeout", r.Header.Get("Fair-Queue-Reason"))
		assert.Equal(t, "7", r.Header.Get("Retry-After"))
		var body map[string]any
		require.NoError(t, json.Unmarshal([]byte(r.Body), &body), "body %q", r.Body)
		assert.Equal(t, map[string]any{"busy": true, "reason": "timeout", "queue": "default"}, body)

		r = send(ctx, client, c.URL(), Chat{Stream: true})
		require.NoError(t, r.Err)
		require.Equal(t, http.StatusOK, r.Status, "%s", r)
		assert.Equal(t, "timeout", r.Header.Get("Fair-Queue-Reason"))
		assert.Equal(t, `event: overloaded
data: {"busy":true,"reason":"timeout","queue":"default"}

`, r.Body)
	})
}
