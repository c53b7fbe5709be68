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

// A cancel of a fair ticket the store does not have (its acquire got no
// answer and never ran, or it ended already: nothing was evicted) does
// not list its flow's waiters to look for it (ZRANGEBYLEX over the
// flow's order: O(the flow's waiters), 50,000 of one tenant): the ticket
// index (K.fticket) holds every waiter, so the ticket waits nowhere.
func TestACancelOfAFairTicketTheStoreLacksDoesNotListItsFlow(t *testing.T) {
	ctx := context.Background()
	rdb, s := openStore(t, "cancel")
	l := fairqueue.Limits{Permits: 1, Lease: 10 * time.Second}
	r, err := s.Acquire(ctx, fairqueue.TicketArgs{ID: "n1:1:h.0", Node: "n1", Limits: l, Cost: 1})
	require.NoError(t, err)
	require.True(t, r.Granted)
	for i := range 2000 {
		r, err := s.Acquire(ctx, fairqueue.TicketArgs{ID: fmt.Sprintf("n2:%d:t.0", i+2), Node: "n2", Limits: l, Cost: 1})
		require.NoError(t, err)
		require.False(t, r.Granted)
	}
	_, _, by := cost(t, rdb, func() {
		require.NoError(t, s.Cancel(ctx, fairqueue.TicketArgs{ID: "n2:99999:t.0", Node: "n2", Limits: l, Cost: 1, Tombstone: true}))
	})
	t.Logf("cancel: %v", by)
	assert.Zero(t, by["zrangebylex"], "ZRANGEBYLEX of a cancel of a ticket the store lacks: %v", by)
}
