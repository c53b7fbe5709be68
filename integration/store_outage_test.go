package integration

import (
	"context"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/fair-queue/caddy-fair-queue/internal/harness"
	"github.com/fair-queue/caddy-fair-queue/internal/mockllm"
	"github.com/fair-queue/caddy-fair-queue/internal/redistest"
)

// With Redis gone, on_store_error decides: fail_closed answers 503
// store_unavailable at once, fail_open lets requests through. Neither
// hangs, and both queue again once Redis is back.
func TestFailClosedAndFailOpen(t *testing.T) {
	rds := redistest.Start(t)
	mock, upstream := harness.StartMockLLM(t, mockllm.Config{Tokens: 2})
	config := func(policy string) string {
		return proxySite(upstream, fmt.Sprintf(`
	fair_queue {
		permits 2
		max_wait 20s
		redis {
			url redis://%s/0
		}
		on_store_error %s
	}`, rds.Addr(), policy))
	}
	closed := harness.StartCaddy(t, "fail-closed", config("fail_closed"), harness.CaddyOptions{})
	open := harness.StartCaddy(t, "fail-open", config("fail_open"), harness.CaddyOptions{})
	client := newClient(t)
	ctx := context.Background()
	for _, c := range []*harness.Caddy{closed, open} {
		requireFullStream(t, send(ctx, client, c.URL(), Chat{Stream: true}), 2, "%s with Redis up", c.Name())
	}

	rds.Kill()

	start := time.Now()
	r := send(ctx, client, closed.URL(), Chat{})
	requireJSONReject(t, r, http.StatusServiceUnavailable, "store_unavailable")
	assert.Less(t, time.Since(start), 3*time.Second, "fail_closed answered late")
	start = time.Now()
	requireSSEReject(t, send(ctx, client, closed.URL(), Chat{Stream: true}), "store_unavailable")
	assert.Less(t, time.Since(start), 3*time.Second, "fail_closed answered late")

	mock.Reset()
	for range 3 {
		start = time.Now()
		requireFullStream(t, send(ctx, client, open.URL(), Chat{Stream: true}), 2, "fail_open with Redis down")
		assert.Less(t, time.Since(start), 3*time.Second, "fail_open answered late")
	}
	assert.Equal(t, 3, mock.Served())

	// Redis comes back (empty): both queue again.
	rds.Restart()
	for _, c := range []*harness.Caddy{closed, open} {
		ok := eventually(15*time.Second, func() bool {
			r := send(ctx, client, c.URL(), Chat{Stream: true})
			return r.Err == nil && r.Status == http.StatusOK && r.Header.Get("Fair-Queue-Reason") == ""
		})
		assert.True(t, ok, "%s did not serve again after Redis came back", c.Name())
	}
	// Both nodes are back in the queue.
	q := Queue{rdb: rds.Client(t), name: "default"}
	assert.Equal(t, 2, q.Nodes(t), "nodes registered in Redis")
	assert.Zero(t, q.Holders(t), "permits left held")
}
