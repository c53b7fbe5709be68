package storetest

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
)

func init() {
	cases = append(cases,
		testCase{"DeadNodesWaitersDoNotFillTheQueueCap", deadWaitersCap},
	)
}

// The waiters of a node that died (a crashed instance: nothing cancels
// them) are no waiting requests: once the node is forgotten they count
// against no max_queue, while every permit stays held and no dispatch
// reaches them. a holds the permit; b queues two requests and dies; a's
// next request under max_queue 2 waits, first in line.
func deadWaitersCap(t *testing.T, h Harness) {
	a, b := store(t, h, "deadcap", "a"), store(t, h, "deadcap", "b")
	long := fairqueue.Limits{Permits: 1, Lease: time.Minute, MaxQueue: 2}
	short := long
	short.Lease = time.Second
	mustAcquire(t, a, ticket("a:1", "a", long), true)
	mustAcquire(t, b, ticket("b:1", "b", short), false)
	mustAcquire(t, b, ticket("b:2", "b", short), false)
	time.Sleep(1500 * time.Millisecond) // b's liveness ends
	_, err := a.Reconcile(bg, "a", long)
	require.NoError(t, err)
	res := mustAcquire(t, a, ticket("a:2", "a", long), false)
	assert.False(t, res.Full, "b's waiters fill max_queue")
	assert.Equal(t, 1, res.Position)
	require.NoError(t, a.Cancel(bg, ticket("a:2", "a", long)))
	require.NoError(t, a.Leave(bg, "a", long))
}
