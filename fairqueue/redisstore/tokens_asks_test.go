package redisstore_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
	"github.com/fair-queue/caddy-fair-queue/fairqueue/redisstore"
)

// What a waiter asks (TicketArgs.Asks) is kept beside its weight in the
// tok hash; a node of an earlier version that grants the waiter takes
// the weight alone and leaves the ask. Reconcile drops such leftovers
// once nobody waits, and keeps the asks of tickets still waiting.
func TestReconcileDropsTheAsksAnEarlierVersionLeft(t *testing.T) {
	rdb, s := openStore(t, "asksleft")
	ctx := context.Background()
	five := fairqueue.Limits{Permits: 10, Lease: 10 * time.Second, Tokens: 5, TokenBound: 5}
	eight := fairqueue.Limits{Permits: 10, Lease: 10 * time.Second, Tokens: 8, TokenBound: 8}
	tok := s.Tag() + ":tok"
	n1 := fairqueue.TicketArgs{ID: "n1:1", Node: "n1", Limits: five, Cost: 1, Tokens: 1}
	n2 := fairqueue.TicketArgs{ID: "n1:2", Node: "n1", Limits: five, Cost: 1, Tokens: 5, Asks: 7}
	acquireGranted(t, s, n1)
	r, err := s.Acquire(ctx, n2)
	require.NoError(t, err)
	require.False(t, r.Granted, "1 + 5 tokens do not fit 5")
	assert.Equal(t, map[string]string{"n1:2": "5", "+n1:2": "7"}, rdb.HGetAll(ctx, tok).Val())

	// An earlier version granted n1:9, which asked 12, and left its ask.
	require.NoError(t, rdb.HSet(ctx, tok, "+n1:9", 12).Err())
	_, err = s.Reconcile(ctx, "n1", five)
	require.NoError(t, err)
	assert.Equal(t, map[string]string{"n1:2": "5", "+n1:2": "7", "+n1:9": "12"}, rdb.HGetAll(ctx, tok).Val(),
		"kept while a ticket waits")

	// The capacity was raised: n1:2 is granted weighing what it asks.
	require.NoError(t, s.Release(ctx, fairqueue.TicketArgs{ID: n1.ID, Node: "n1", Limits: eight}))
	assert.Equal(t, map[string]string{"+n1:9": "12"}, rdb.HGetAll(ctx, tok).Val(), "n1:2's weight and ask taken out")
	snap, err := s.Inspect(ctx, 0, 0)
	require.NoError(t, err)
	assert.Equal(t, 7, snap.TokensHeld)

	_, err = s.Reconcile(ctx, "n1", eight)
	require.NoError(t, err)
	assert.Zero(t, rdb.Exists(ctx, tok).Val(), "nobody waits: the leftover ask is dropped")
	require.NoError(t, s.Release(ctx, fairqueue.TicketArgs{ID: n2.ID, Node: "n1", Limits: eight}))
	require.NoError(t, s.Leave(ctx, "n1", eight))
	assert.Empty(t, rdb.Keys(ctx, s.Tag()+"*").Val())
}

// Reconcile drops the tok hash only where nobody waits: a fair waiter
// whose ticket index (K.fticket) Redis evicted under maxmemory still
// waits in its flow's order (K.fwait), and dispatch grants it from
// there. Its weight, and what it asks, stay: granted weighing nothing,
// it would hold its tokens uncounted beside grants that fill the
// capacity.
func TestReconcileKeepsTheWeightsOfWaitersWhoseIndexWasEvicted(t *testing.T) {
	rdb, s := openStore(t, "asksevicted")
	ctx := context.Background()
	five := fairqueue.Limits{Permits: 1, Lease: 10 * time.Second, Tokens: 5, TokenBound: 5}
	eight := fairqueue.Limits{Permits: 1, Lease: 10 * time.Second, Tokens: 8, TokenBound: 8}
	holder := fairqueue.TicketArgs{ID: "n1:1:a.0", Node: "n1", Limits: five, Cost: 1, Tokens: 1}
	acquireGranted(t, s, holder)
	waiter := fairqueue.TicketArgs{ID: "n1:2:a.0", Node: "n1", Limits: five, Cost: 1, Tokens: 5, Asks: 7}
	r, err := s.Acquire(ctx, waiter)
	require.NoError(t, err)
	require.False(t, r.Granted, "no permit free")
	require.NoError(t, rdb.Del(ctx, s.Tag()+":fticket").Err()) // evicted

	_, err = s.Reconcile(ctx, "n1", five)
	require.NoError(t, err)
	holder.Limits = eight
	require.NoError(t, s.Release(ctx, holder))
	snap, err := s.Inspect(ctx, 0, 0)
	require.NoError(t, err)
	require.Len(t, snap.Holders, 1)
	require.Equal(t, waiter.ID, snap.Holders[0].Ticket, "the waiter is granted from its flow's order")
	assert.Equal(t, 7, snap.TokensHeld, "the waiter granted weighing what it asks")
}

// A fair waiter whose flow's order (K.fwait) Redis evicted waits
// nowhere: the heartbeat that names it takes its index entry out, so
// that its node queues it again, and its weight and what it asks go with
// it. Left behind, they outlived its grant on the fast path (nobody else
// waiting): the tok hash stayed in Redis for as long as the queue lived,
// nobody waiting.
func TestAWaiterWhoseOrderWasEvictedLeavesNoWeightBehind(t *testing.T) {
	rdb, s := openStore(t, "orderevicted")
	ctx := context.Background()
	five := fairqueue.Limits{Permits: 1, Lease: 10 * time.Second, Tokens: 5, TokenBound: 5}
	holder := fairqueue.TicketArgs{ID: "n1:1:a.0", Node: "n1", Limits: five, Cost: 1, Tokens: 1}
	r := acquireGranted(t, s, holder)
	waiter := fairqueue.TicketArgs{ID: "n1:2:a.0", Node: "n1", Limits: five, Cost: 1, Tokens: 5, Asks: 7}
	q, err := s.Acquire(ctx, waiter)
	require.NoError(t, err)
	require.False(t, q.Granted, "no permit free")
	require.NoError(t, rdb.Del(ctx, s.Tag()+":fwait").Err()) // evicted

	hb, err := s.Heartbeat(ctx, fairqueue.HeartbeatArgs{Node: "n1", Limits: five, Epoch: r.Epoch, Beat: 1,
		Held: []string{holder.ID}, Pending: []string{waiter.ID}})
	require.NoError(t, err)
	require.Equal(t, []string{waiter.ID}, hb.Missing, "the waiter waits nowhere")
	require.NoError(t, s.Release(ctx, holder))
	acquireGranted(t, s, waiter) // queued again, granted at once
	assert.Empty(t, rdb.HGetAll(ctx, s.Tag()+":tok").Val(), "weights left for tickets no longer waiting")
	snap, err := s.Inspect(ctx, 0, 0)
	require.NoError(t, err)
	assert.Equal(t, 5, snap.TokensHeld)
}

// Each way a waiter leaves the queue takes its weight and what it asks
// out of the tok hash with it, at once: a cancel (under a config that a
// reload turned kv_tokens off), a grant at what it asks, a requeue's new
// ticket (recorded, then granted), the waiters of a node that crashed
// (another node's reconcile), a waiter a heartbeat names held (a lost
// transfer), the waiter of a node that left (dropped at the head). A
// waiter stays queued throughout where a reconcile runs: it drops the
// whole hash once nobody waits, which would hide a field left behind.
func TestEveryEndOfAWaiterTakesWhatItAsksWithIt(t *testing.T) {
	rdb, s := openStore(t, "asksends")
	ctx := context.Background()
	lim := func(tokens int) fairqueue.Limits {
		return fairqueue.Limits{Permits: 2, Lease: time.Minute, Tokens: tokens, TokenBound: tokens}
	}
	five, eight, off := lim(5), lim(8), lim(0)
	asking := func(id string, l fairqueue.Limits) fairqueue.TicketArgs {
		return fairqueue.TicketArgs{ID: id, Node: fairqueue.TicketNode(id), Limits: l, Cost: 1, Tokens: 5, Asks: 7}
	}
	queued := func(s *redisstore.Store, a fairqueue.TicketArgs) fairqueue.AcquireResult {
		t.Helper()
		r, err := s.Acquire(ctx, a)
		require.NoError(t, err)
		require.False(t, r.Granted, "%s granted", a.ID)
		return r
	}
	left := func(msg string, ids ...string) {
		t.Helper()
		want := map[string]string{}
		for _, id := range ids {
			want[id], want["+"+id] = "5", "7"
		}
		assert.Equal(t, want, rdb.HGetAll(ctx, s.Tag()+":tok").Val(), msg)
	}
	held := func(want int, msg string) {
		t.Helper()
		snap, err := s.Inspect(ctx, 0, 0)
		require.NoError(t, err)
		assert.Equal(t, want, snap.TokensHeld, msg)
	}
	node := func(name string) *redisstore.Store {
		n := redisstore.New(rdb, "asksends", redisstore.Options{})
		require.NoError(t, n.Open(ctx, name, nopListener{}))
		t.Cleanup(func() { _ = n.Close() })
		return n
	}

	// pin holds 1 token: under 5 an ask of 7 (weighing 5) waits, under 8 it fits.
	pin := fairqueue.TicketArgs{ID: "n1:1", Node: "n1", Limits: five, Cost: 1, Tokens: 1}
	first := acquireGranted(t, s, pin)
	h := fairqueue.TicketArgs{ID: "n1:2", Node: "n1", Limits: five, Cost: 1}
	acquireGranted(t, s, h)

	w3 := asking("n1:3", five)
	queued(s, w3)
	left("recorded", "n1:3")
	require.NoError(t, s.Cancel(ctx, fairqueue.TicketArgs{ID: w3.ID, Node: "n1", Limits: off}))
	left("cancelled under a config that counts no tokens")

	w4 := asking("n1:4", five)
	r4 := queued(s, w4)
	h.Limits = eight
	require.NoError(t, s.Release(ctx, h))
	left("granted")
	held(8, "granted at what it asks")

	w5 := asking("n1:5", eight)
	queued(s, w5)
	w6 := asking("n1:6", five)
	_, err := s.Requeue(ctx, fairqueue.RequeueArgs{TicketArgs: w6, Old: w4.ID, Seq: r4.Seq})
	require.NoError(t, err)
	left("the requeue's new ticket waits, recorded", "n1:5", "n1:6")
	pin.Limits = eight
	require.NoError(t, s.Release(ctx, pin))
	left("the requeue's new ticket granted", "n1:5")
	held(7, "granted at what it asks")

	crashed := fairqueue.Limits{Permits: 2, Lease: 200 * time.Millisecond, Tokens: 8, TokenBound: 8}
	n2 := node("n2")
	queued(n2, asking("n2:1", crashed))
	queued(n2, asking("n2:2:t.0", crashed))
	left("the crashing node's waiters recorded", "n1:5", "n2:1", "n2:2:t.0")
	time.Sleep(3 * crashed.Lease)
	_, err = s.Reconcile(ctx, "n1", eight)
	require.NoError(t, err)
	left("the crashed node's waiters dropped", "n1:5")

	_, err = s.Heartbeat(ctx, fairqueue.HeartbeatArgs{Node: "n1", Limits: eight, Epoch: first.Epoch, Beat: 1,
		Held: []string{w6.ID}})
	require.NoError(t, err)
	_, err = s.Heartbeat(ctx, fairqueue.HeartbeatArgs{Node: "n1", Limits: eight, Epoch: first.Epoch, Beat: 2,
		Held: []string{w6.ID, w5.ID}, Tokens: map[string]int{w5.ID: 7}})
	require.NoError(t, err)
	left("the waiter the heartbeat names held")
	held(14, "each counted at what it asks")

	n3 := node("n3")
	queued(n3, asking("n3:1", eight))
	require.NoError(t, n3.Leave(ctx, "n3", eight))
	left("the waiter of the node that left, until it heads the queue", "n3:1")
	w6.Limits = eight
	require.NoError(t, s.Release(ctx, w6))
	left("the waiter of the node that left, dropped")
	w5.Limits = eight
	require.NoError(t, s.Release(ctx, w5))
	require.NoError(t, s.Leave(ctx, "n1", eight))
	assert.Empty(t, rdb.Keys(ctx, s.Tag()+"*").Val())
}
