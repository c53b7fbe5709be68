package caddyfairqueue

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/internal/redistest"
)

// At exit, once the grace period is over, Caddy cleans the handlers up
// and each of their queues leaves Redis. While Redis does not answer (a
// frozen server, a partition), every leave runs to its store timeouts:
// one queue after the other, a handler of a queue per model stopped for
// about a second and a half per queue (100 queues, more than two
// minutes, past a service manager's stop timeout), after the grace
// period. The queues leave together: the stop takes about one queue's
// timeouts, however many queues.
func TestExitDuringARedisOutageLeavesTheQueuesTogether(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	rds := redistest.Start(t)
	h := provision(t, newContext(t), rds.Addr(), &Handler{Name: "{http.fair_queue.model}", Permits: 1})
	const queues = 12
	for i := range queues {
		require.Equal(t, "granted", model(t, h, fmt.Sprintf("m%d", i)).placeholder(phOutcome))
	}
	require.Len(t, h.engineList(), queues)

	rds.Freeze()
	exitingForTest.Store(true)
	t.Cleanup(func() { exitingForTest.Store(false) })
	h.onShutdown(true)
	start := time.Now()
	_ = h.Cleanup() // each leave fails: Redis does not answer
	took := time.Since(start)
	rds.Thaw()
	// Each queue's leave waits at least its 1s store timeout: one after
	// the other they take 12s or more.
	assert.Less(t, took, 6*time.Second, "the %d queues' cleanup during the outage", queues)
}
