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

// A heartbeat that adopts a fair ticket Redis still has queued (its
// acquire reached Redis, its answer did not, and the node admitted it
// by on_store_error; or a holder re-added whose transfer a failover
// lost) takes it out of the queue: it runs once, counts for its flow
// and tenant (max_in_flight_per_tenant) and its tokens, is never
// granted again, and once every permit ends and the node leaves, the
// tenant's counters are back to zero and no key is left.
func TestAdoptedTicketStillQueuedLeavesTheQueueAndItsCounts(t *testing.T) {
	// held: the ticket is named as held instead, by a live node: a local
	// handoff whose transfer a failover lost (heartbeat.lua re-adds it).
	for _, held := range []bool{false, true} {
		t.Run(fmt.Sprintf("held=%v", held), func(t *testing.T) { adoptQueued(t, held) })
	}
}

func adoptQueued(t *testing.T, held bool) {
	rdb, s := openStore(t, "adoptqueued")
	ctx := context.Background()
	l := fairqueue.Limits{Permits: 2, Tokens: 100, TokenBound: 100, Lease: 30 * time.Second, MaxInFlightPerTenant: 1}
	ticket := func(n int, flow string, tokens int) fairqueue.TicketArgs {
		return fairqueue.TicketArgs{ID: fmt.Sprintf("n1:%d:%s", n, flow), Node: "n1", Limits: l, Cost: 1, Tokens: tokens}
	}
	// x1 holds tenant x's one permit; x2 and x3 wait behind the cap.
	x1, x2, x3 := ticket(1, "x.0", 10), ticket(2, "x.0", 20), ticket(3, "x.0", 30)
	r, err := s.Acquire(ctx, x1)
	require.NoError(t, err)
	require.True(t, r.Granted)
	for _, a := range []fairqueue.TicketArgs{x2, x3} {
		r, err = s.Acquire(ctx, a)
		require.NoError(t, err)
		require.False(t, r.Granted, "%s queued behind tenant x's cap", a.ID)
	}

	// x2 is adopted: admitted while the node could not reach Redis; or
	// named held by the live node, in its second heartbeat.
	args := fairqueue.HeartbeatArgs{Node: "n1", Limits: l, Beat: 1,
		Held: []string{x1.ID}, Adopt: []string{x2.ID}, Tokens: map[string]int{x1.ID: 10, x2.ID: 20}}
	if held {
		first := args
		first.Adopt = nil
		r, err := s.Heartbeat(ctx, first)
		require.NoError(t, err)
		args.Beat, args.Epoch, args.Held, args.Adopt = 2, r.Epoch, []string{x1.ID, x2.ID}, nil
	}
	_, err = s.Heartbeat(ctx, args)
	require.NoError(t, err)
	st := readState(t, rdb, "adoptqueued")
	assert.ElementsMatch(t, []string{x1.ID, x2.ID}, st.Holders, "the adopted ticket holds a permit")
	assert.Equal(t, []string{x3.ID}, st.Waiting, "the adopted ticket left the queue")
	finf, err := rdb.HGetAll(ctx, s.Tag()+":finf").Result()
	require.NoError(t, err)
	assert.Equal(t, "2", finf["x"], "tenant x holds both running permits")
	tsum, err := rdb.Get(ctx, s.Tag()+":tsum").Int()
	require.NoError(t, err)
	assert.Equal(t, 30, tsum, "the tokens held: x1's and the adopted x2's")
	tok, err := rdb.HExists(ctx, s.Tag()+":tok", x2.ID).Result()
	require.NoError(t, err)
	assert.False(t, tok, "the adopted ticket's waiting weight left with it")

	// x1 ends: tenant x still holds x2, its cap; x3 waits on.
	require.NoError(t, s.Release(ctx, x1))
	st = readState(t, rdb, "adoptqueued")
	assert.Equal(t, []string{x2.ID}, st.Holders, "x3 granted beside the adopted x2 above tenant x's cap, or x2 granted again")
	assert.Equal(t, []string{x3.ID}, st.Waiting)
	// x2 ends: x3 is granted, once.
	require.NoError(t, s.Release(ctx, x2))
	st = readState(t, rdb, "adoptqueued")
	assert.Equal(t, []string{x3.ID}, st.Holders, "x3 is served when the adopted permit ends")
	assert.Empty(t, st.Waiting)
	require.NoError(t, s.Release(ctx, x3))

	for _, k := range []string{"finf", "twait", "fticket", "tok", "thold"} {
		m, err := rdb.HGetAll(ctx, s.Tag()+":"+k).Result()
		require.NoError(t, err)
		assert.Empty(t, m, "%s once every permit ended", k)
	}
	for _, k := range []string{"fwait", "fready", "holders", "waiting"} {
		n, err := rdb.ZCard(ctx, s.Tag()+":"+k).Result()
		require.NoError(t, err)
		assert.Zero(t, n, "%s once every permit ended", k)
	}
	tsum, err = rdb.Get(ctx, s.Tag()+":tsum").Int()
	if err == nil {
		assert.Zero(t, tsum, "tokens held once every permit ended")
	}
	require.NoError(t, s.Leave(ctx, "n1", l))
	assert.Empty(t, allKeys(t, rdb), "keys left after the last node left")
}
