package redisstore_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
)

// The arrival counter (K.seq) orders the waiters: a FIFO waiter's score,
// a fair one's place in its flow. Evicted under maxmemory, it starts over
// at 1, below the waiters queued before: each later arrival would queue
// ahead of them, until as many had arrived as the queue had ever seen
// (in a busy queue they wait out their max_wait). A request arriving
// after the eviction queues behind them.
func TestArrivalsAfterTheCounterWasEvictedQueueBehindTheWaiters(t *testing.T) {
	for _, tc := range []struct {
		name string
		ids  [5]string // holder, four waiters (the fair ones of one flow)
	}{
		{"fifo", [5]string{"n1:1", "n1:2", "n1:3", "n1:4", "n1:5"}},
		{"fair", [5]string{"n1:1:a.0", "n1:2:b.0", "n1:3:b.0", "n1:4:b.0", "n1:5:b.0"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rdb, s := openStore(t, "seqevicted")
			ctx := context.Background()
			l := fairqueue.Limits{Permits: 1, Lease: 10 * time.Second}
			tk := func(i int) fairqueue.TicketArgs {
				return fairqueue.TicketArgs{ID: tc.ids[i], Node: "n1", Limits: l, Cost: 1}
			}
			acquireGranted(t, s, tk(0))
			queue := func(i int) {
				r, err := s.Acquire(ctx, tk(i))
				require.NoError(t, err)
				require.False(t, r.Granted, "no permit free")
			}
			queue(1)
			queue(2)
			require.NoError(t, rdb.Del(ctx, s.Tag()+":seq").Err()) // evicted
			queue(3)
			queue(4)

			prev := tk(0)
			for i := 1; i <= 4; i++ {
				require.NoError(t, s.Release(ctx, prev))
				snap, err := s.Inspect(ctx, 0, 0)
				require.NoError(t, err)
				require.Len(t, snap.Holders, 1)
				assert.Equal(t, tc.ids[i], snap.Holders[0].Ticket, "served in arrival order")
				prev = fairqueue.TicketArgs{ID: snap.Holders[0].Ticket, Node: "n1", Limits: l}
			}
			require.NoError(t, s.Release(ctx, prev))
		})
	}
}

// A request an upstream refused queues again at its arrival number
// (Permit.Requeue), which Redis does not keep for a running request:
// where the arrival counter was evicted meanwhile and nobody waited (the
// counter starts over at 1), the requests arriving after that requeue
// would queue ahead of it until the counter had passed its number. They
// queue behind it.
func TestArrivalsAfterARequeueAtANumberTheCounterLostQueueBehindIt(t *testing.T) {
	rdb, s := openStore(t, "seqrequeue")
	ctx := context.Background()
	l := fairqueue.Limits{Permits: 2, Lease: 10 * time.Second}
	tk := func(id string) fairqueue.TicketArgs {
		return fairqueue.TicketArgs{ID: id, Node: "n1", Limits: l, Cost: 1}
	}
	for _, id := range []string{"n1:1", "n1:2", "n1:3"} {
		acquireGranted(t, s, tk(id))
		require.NoError(t, s.Release(ctx, tk(id)))
	}
	acquireGranted(t, s, tk("n1:4"))
	refused := acquireGranted(t, s, tk("n1:5"))
	require.NoError(t, rdb.Del(ctx, s.Tag()+":seq").Err()) // evicted
	queued := func(id string) {
		t.Helper()
		r, err := s.Acquire(ctx, tk(id))
		require.NoError(t, err)
		require.False(t, r.Granted, "no permit free")
	}
	queued("n1:6")
	_, err := s.Requeue(ctx, fairqueue.RequeueArgs{TicketArgs: tk("n1:7"), Old: "n1:5", Seq: refused.Seq})
	require.NoError(t, err)
	queued("n1:8")
	assert.Equal(t, []string{"n1:7", "n1:8"}, readState(t, rdb, "seqrequeue").Waiting,
		"the requeued request ahead of the later arrival")
}
