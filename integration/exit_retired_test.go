package integration

import (
	"context"
	"fmt"
	"net/http"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/internal/harness"
	"github.com/fair-queue/caddy-fair-queue/internal/mockllm"
	"github.com/fair-queue/caddy-fair-queue/internal/redistest"
)

// A reload that renames the queue leaves the old queue serving its
// waiters. When Caddy then exits, they are answered shutting_down at once
// like any waiter, and once the grace period is over (a stream of the old
// queue still running) the instance leaves the old queue too: the last
// instance of it, it leaves no key in Redis.
func TestSIGTERMAfterARenameAnswersTheOldQueuesWaitersAndLeavesIt(t *testing.T) {
	rds := redistest.Start(t)
	_, upstream := harness.StartMockLLM(t, mockllm.Config{})
	config := func(name string) string {
		return proxySite(upstream, fmt.Sprintf(`
	fair_queue {
		name %s
		permits 1
		max_wait 60s
		redis {
			url redis://%s/0
		}
	}`, name, rds.Addr()))
	}
	const grace = 3 * time.Second
	c := harness.StartCaddy(t, "caddy", config("a"), harness.CaddyOptions{GracePeriod: grace})
	client := newClient(t)
	ctx := context.Background()
	q := Queue{rdb: rds.Client(t), name: "a"}

	// A stream of about 20s, past the grace period, holds queue a's
	// permit; 3 clients wait in it, 2 plain and 1 streaming.
	running := sendAsync(ctx, client, c.URL(), Chat{Stream: true, Tokens: 200, Delay: 100 * time.Millisecond})
	q.awaitHolders(t, 1, 10*time.Second)
	var waiters collect
	const n = 3
	for i := range n {
		waiters.send(ctx, client, c.URL(), strconv.Itoa(i), Chat{Stream: i == n-1})
	}
	q.awaitWaiting(t, n, 10*time.Second)

	require.NoError(t, c.Load(config("b")))
	c.Signal(syscall.SIGTERM)
	term := time.Now()
	results := waiters.wait(t, time.Minute)
	for i := range n {
		r := results[strconv.Itoa(i)]
		if i < n-1 {
			requireJSONReject(t, r, http.StatusServiceUnavailable, "shutting_down")
		} else {
			requireSSEReject(t, r, "shutting_down")
		}
		assert.Less(t, r.Done.Sub(term), grace, "waiter %d answered late", i)
	}

	c.WaitExit(harness.ExitTimeout)
	await(t, running, time.Minute) // cut at the exit
	assert.Zero(t, q.Waiting(t), "waiting tickets left in Redis")
	assert.Zero(t, q.Holders(t), "permits left held in Redis")
	assert.Zero(t, q.Nodes(t), "nodes left in Redis")
	assert.Empty(t, rds.Keys(t, "{fair_queue:*"), "keys left in Redis")
}
