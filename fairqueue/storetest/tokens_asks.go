package storetest

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
)

// A waiter is weighed at its grant: by what it asks (TicketArgs.Asks),
// bounded by the capacity of the call that grants it, where that call
// counts tokens; by the weight its node gave it (TicketArgs.Tokens)
// where that call counts none, or where it names no ask (a node of an
// earlier version queued it).
func init() {
	cases = append(cases, testCase{"TokensAWaiterIsWeighedAtItsGrant", tokensAsks})
}

func tokensAsks(t *testing.T, h Harness) {
	s := store(t, h, "asks", "n1")
	in, ok := s.(fairqueue.Inspector)
	if !ok {
		t.Skip("the store has no Inspect")
	}
	five := fairqueue.Limits{Permits: 10, Lease: time.Minute, Tokens: 5, TokenBound: 5}
	eight := fairqueue.Limits{Permits: 10, Lease: time.Minute, Tokens: 8, TokenBound: 8}
	off := fairqueue.Limits{Permits: 10, Lease: time.Minute}
	acquire := func(id string, l fairqueue.Limits, tokens, asks int) bool {
		t.Helper()
		res, err := s.Acquire(bg, fairqueue.TicketArgs{ID: id, Node: "n1", Limits: l, Cost: 1, Tokens: tokens, Asks: asks})
		require.NoError(t, err)
		return res.Granted
	}
	release := func(id string, l fairqueue.Limits) {
		t.Helper()
		require.NoError(t, s.Release(bg, fairqueue.TicketArgs{ID: id, Node: "n1", Limits: l}))
	}
	holds := func(id string, tokens int, msg string) {
		t.Helper()
		snap, err := in.Inspect(bg, 0, 0)
		require.NoError(t, err)
		require.Len(t, snap.Holders, 1, "%s: one holder", msg)
		assert.Equal(t, id, snap.Holders[0].Ticket, msg)
		assert.Equal(t, tokens, snap.Holders[0].Tokens, msg)
		assert.Equal(t, tokens, snap.TokensHeld, msg)
	}

	// Under a capacity of 5: n1:2 asks 7 (clamped to 5), n1:3 weighs 5
	// and names no ask; both wait behind n1:1.
	require.True(t, acquire("n1:1", five, 1, 0))
	require.False(t, acquire("n1:2", five, 5, 7))
	require.False(t, acquire("n1:3", five, 5, 0))

	// A reload raised the capacity to 8: n1:2 is granted weighing 7, and
	// n1:3 (5 more) waits.
	release("n1:1", eight)
	holds("n1:2", 7, "granted under 8, weighing what it asks")
	assert.False(t, acquire("n1:4", eight, 2, 0), "2 tokens beside 7 of 8, behind n1:3")
	require.NoError(t, s.Cancel(bg, fairqueue.TicketArgs{ID: "n1:4", Node: "n1", Limits: eight}))

	// n1:3 named no ask: its weight stands.
	release("n1:2", eight)
	holds("n1:3", 5, "granted under 8, weighing the weight it was queued with")

	// n1:5 asks 7 (5 where it queued); a call that counts no tokens
	// grants it: the weight its node gave it counts.
	require.False(t, acquire("n1:5", eight, 5, 7))
	release("n1:3", off)
	holds("n1:5", 5, "granted by a call that counts no tokens")
	release("n1:5", eight)
	require.NoError(t, s.Leave(bg, "n1", eight))
}
