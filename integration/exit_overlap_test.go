package integration

import (
	"context"
	"fmt"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/fair-queue/caddy-fair-queue/internal/harness"
	"github.com/fair-queue/caddy-fair-queue/internal/mockllm"
	"github.com/fair-queue/caddy-fair-queue/internal/redistest"
)

// Instance a exits while its stream outlasts the grace period: the stream
// runs at the upstream until a's process ends. Its exit ends the stream
// and holds the permit for the abort grace before it leaves the queue, so
// instance b's waiter reaches the upstream only once the upstream has
// stopped the stream: never two requests under permits 1. (Before, the
// leave freed the permit while the stream still ran.)
func TestInstanceExitingPastItsGracePeriodNeverRunsTheUpstreamAbovePermits(t *testing.T) {
	rds := redistest.Start(t)
	mock, upstream := harness.StartMockLLM(t, mockllm.Config{})
	site := proxySite(upstream, fmt.Sprintf(`
	fair_queue {
		permits 1
		max_wait 60s
		abort_grace 500ms
		redis {
			url redis://%s/0
		}
	}`, rds.Addr()))
	a := harness.StartCaddy(t, "a", site, harness.CaddyOptions{GracePeriod: 2 * time.Second})
	b := harness.StartCaddy(t, "b", site, harness.CaddyOptions{GracePeriod: 2 * time.Second})
	client := newClient(t)
	ctx := context.Background()
	q := Queue{rdb: rds.Client(t), name: "default"}
	running := sendAsync(ctx, client, a.URL(), Chat{Stream: true, Tokens: 400, Delay: 50 * time.Millisecond})
	q.awaitHolders(t, 1, 10*time.Second)
	var waiters collect
	for i := range 2 {
		waiters.send(ctx, client, b.URL(), fmt.Sprint(i), Chat{Stream: true, Tokens: 5, Delay: 50 * time.Millisecond})
	}
	q.awaitWaiting(t, 2, 10*time.Second)
	a.Signal(syscall.SIGTERM)
	a.WaitExit(harness.ExitTimeout)
	await(t, running, time.Minute)
	waiters.wait(t, time.Minute)
	assert.Equal(t, 1, mock.MaxInFlight(), "requests at the upstream at once, permits 1")
}
