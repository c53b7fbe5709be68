package storetest

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
)

// A requeued request keeps its weight in tokens while it waits, also
// when it was put back under settings that count no tokens (a reload
// turned kv_tokens off): granted after a reload turned them on again, it
// holds its weight, and requests that do not fit beside it wait.
func init() {
	cases = append(cases, testCase{"TokensRequeuedAcrossAReloadKeepsItsWeight", tokensRequeueReload})
}

func tokensRequeueReload(t *testing.T, h Harness) {
	s := store(t, h, "requeue-weight", "n1")
	in, ok := s.(fairqueue.Inspector)
	if !ok {
		t.Skip("the store has no Inspect")
	}
	counted := fairqueue.Limits{Permits: 2, Lease: time.Minute, Tokens: 8, TokenBound: 8}
	off := fairqueue.Limits{Permits: 1, Lease: time.Minute} // kv_tokens off, permits lowered
	acquire := func(id string, l fairqueue.Limits, tokens int) fairqueue.AcquireResult {
		t.Helper()
		res, err := s.Acquire(bg, fairqueue.TicketArgs{ID: id, Node: "n1", Limits: l, Cost: 1, Tokens: tokens})
		require.NoError(t, err)
		return res
	}
	first := acquire("n1:1", counted, 6)
	require.True(t, first.Granted)
	require.True(t, acquire("n1:2", counted, 0).Granted)

	// The upstream refused n1:1 after a reload turned tokens off: it is
	// put back at its place (n1:3) and waits, the one permit being held.
	res, err := s.Requeue(bg, fairqueue.RequeueArgs{TicketArgs: fairqueue.TicketArgs{ID: "n1:3", Node: "n1", Limits: off,
		Cost: 1, Tokens: 6, Correction: -1}, Old: "n1:1", Seq: first.Seq})
	require.NoError(t, err)
	require.False(t, res.Granted)

	// Tokens count again; n1:2 ends and n1:3 is served, weighing 6.
	require.NoError(t, s.Release(bg, fairqueue.TicketArgs{ID: "n1:2", Node: "n1", Limits: counted}))
	snap, err := in.Inspect(bg, 0, 0)
	require.NoError(t, err)
	require.Len(t, snap.Holders, 1)
	assert.Equal(t, "n1:3", snap.Holders[0].Ticket)
	assert.Equal(t, 6, snap.Holders[0].Tokens, "the requeued request's weight")
	assert.Equal(t, 6, snap.TokensHeld)
	assert.False(t, acquire("n1:4", counted, 4).Granted, "4 tokens more than the 8 with 6 held")
	require.NoError(t, s.Leave(bg, "n1", counted))
}
