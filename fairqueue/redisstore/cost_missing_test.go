package redisstore_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
)

// A heartbeat that names a fair waiter the store no longer has (cancelled
// or dropped with its forgotten node: nothing was evicted) costs the same
// whatever the number of fair waiters: the ticket index (K.fticket) is
// rebuilt from the flows' order only where Redis lost it, not listed and
// written again on every such heartbeat (O(waiters): 50,000 of them).
func TestAHeartbeatNamingAMissingWaiterCostsTheSameWhateverTheWaiters(t *testing.T) {
	ctx := context.Background()
	var costs []int64
	for _, waiters := range []int{1, 2000} {
		rdb, s := openStore(t, "missing")
		l := fairqueue.Limits{Permits: 1, Lease: 10 * time.Second}
		h := fairqueue.TicketArgs{ID: "n1:1:h.0", Node: "n1", Limits: l, Cost: 1}
		r, err := s.Acquire(ctx, h)
		require.NoError(t, err)
		require.True(t, r.Granted)
		for i := range waiters {
			r, err := s.Acquire(ctx, fairqueue.TicketArgs{ID: fmt.Sprintf("n2:%d:t%d.0", i+2, i), Node: "n2", Limits: l, Cost: 1})
			require.NoError(t, err)
			require.False(t, r.Granted)
		}
		gone := fairqueue.TicketArgs{ID: "n2:99999:t0.0", Node: "n2", Limits: l, Cost: 1}
		r, err = s.Acquire(ctx, gone)
		require.NoError(t, err)
		require.NoError(t, s.Cancel(ctx, gone))
		all, _, by := cost(t, rdb, func() {
			res, err := s.Heartbeat(ctx, fairqueue.HeartbeatArgs{Node: "n2", Limits: l, Beat: 1, Pending: []string{gone.ID}})
			require.NoError(t, err)
			assert.Equal(t, []string{gone.ID}, res.Missing)
		})
		t.Logf("%d waiters: %d commands %v", waiters, all, by)
		costs = append(costs, all)
	}
	assert.Equal(t, costs[0], costs[1], "commands of a heartbeat naming a missing waiter, beside 1 fair waiter and beside 2,000")
}
