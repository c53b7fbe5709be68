package integration

import (
	"context"
	"fmt"
	"net/http"
	"slices"
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

func TestReloadKeepsWaitersAndLimit(t *testing.T) {
	t.Parallel() // its own Caddy, upstream and Redis: it waits on them, not on the CPU
	rds := redistest.Start(t)
	mock, upstream := harness.StartMockLLM(t, mockllm.Config{Tokens: 6, Delay: 100 * time.Millisecond})
	config := func(maxWait string) string {
		return proxySite(upstream, fmt.Sprintf(`
	fair_queue {
		name llm
		permits 2
		max_wait %s
		redis {
			url redis://%s/0
		}
	}`, maxWait, rds.Addr()))
	}
	// The old server's grace period must outlast its queued requests.
	c := harness.StartCaddy(t, "caddy", config("60s"), harness.CaddyOptions{GracePeriod: 30 * time.Second})
	client := newClient(t)
	ctx := context.Background()
	q := Queue{rdb: rds.Client(t), name: "llm"}

	// 10 clients of the old config: 2 served, 8 queued.
	const before, after, tokens = 10, 6, 6
	var all collect
	for i := range before {
		all.send(ctx, client, c.URL(), "old-"+strconv.Itoa(i), Chat{Stream: true, Seq: "old-" + strconv.Itoa(i)})
	}
	// Wait until every one has reached Caddy and some still wait.
	queued := eventually(10*time.Second, func() bool {
		waiting := q.Waiting(t)
		return waiting > 0 && waiting+mock.InFlight()+mock.Served() == before
	})
	require.True(t, queued, "clients of the old config not queued")

	require.NoError(t, c.Load(config("61s")))
	// Clients of the new config join the same queue, behind the old ones
	// (a connection the listener swap resets before any answer is sent
	// again, as a client would: Caddy's, not the queue's).
	for i := range after {
		all.sendAcrossSwap(ctx, client, c.URL(), "new-"+strconv.Itoa(i), Chat{Stream: true, Seq: "new-" + strconv.Itoa(i)})
	}

	results := all.wait(t, 3*time.Minute)
	require.Len(t, results, before+after)
	for name, r := range results {
		requireFullStream(t, r, tokens, "client %s", name)
	}
	assert.Equal(t, 2, mock.MaxInFlight(), "requests at the upstream at once")
	assert.Equal(t, before+after, mock.Served())
	// Waiting tickets kept their place across the reload.
	arrivals := mock.Arrivals()
	firstNew := slices.IndexFunc(arrivals, func(s string) bool { return s[:4] == "new-" })
	assert.Equal(t, before, firstNew, "a new client overtook a waiter of the old config: %v", arrivals)
	assert.Zero(t, q.Waiting(t))
	assert.Zero(t, q.Holders(t))
}

func TestSIGTERMAnswersWaitersAndLeavesRedisClean(t *testing.T) {
	rds := redistest.Start(t)
	_, upstream := harness.StartMockLLM(t, mockllm.Config{})
	c := harness.StartCaddy(t, "caddy", proxySite(upstream, fmt.Sprintf(`
	fair_queue {
		permits 1
		max_wait 60s
		redis {
			url redis://%s/0
		}
	}`, rds.Addr())), harness.CaddyOptions{GracePeriod: 5 * time.Second})
	client := newClient(t)
	ctx := context.Background()
	q := Queue{rdb: rds.Client(t), name: "default"}

	// One stream of about 2s holds the permit; 5 clients wait, 3 plain
	// and 2 streaming.
	const holderTokens = 20
	running := sendAsync(ctx, client, c.URL(), Chat{Stream: true, Tokens: holderTokens, Delay: 100 * time.Millisecond})
	q.awaitHolders(t, 1, 10*time.Second)
	var waiters collect
	const n = 5
	for i := range n {
		waiters.send(ctx, client, c.URL(), strconv.Itoa(i), Chat{Stream: i >= 3})
	}
	q.awaitWaiting(t, n, 10*time.Second)

	c.Signal(syscall.SIGTERM)
	term := time.Now()
	results := waiters.wait(t, time.Minute)
	for i := range n {
		r := results[strconv.Itoa(i)]
		if i < 3 {
			requireJSONReject(t, r, http.StatusServiceUnavailable, "shutting_down")
		} else {
			requireSSEReject(t, r, "shutting_down")
		}
		assert.Less(t, r.Done.Sub(term), 3*time.Second, "waiter %d answered late", i)
	}

	// The running stream finishes within the grace period.
	requireFullStream(t, await(t, running, time.Minute), holderTokens, "stream running at SIGTERM")
	c.WaitExit(harness.ExitTimeout)

	assert.Zero(t, q.Waiting(t), "waiting tickets left in Redis")
	assert.Zero(t, q.Holders(t), "permits left held in Redis")
	assert.Zero(t, q.Nodes(t), "nodes left in Redis")
	assert.Empty(t, rds.Keys(t, "{fair_queue:*"), "keys left in Redis")
}
