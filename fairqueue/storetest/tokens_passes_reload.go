package storetest

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
)

// In fair order with tokens, the lighter grants that pass a heavy head
// (at most fairqueue.TokenPasses in a row) are counted again from zero at
// every grant to the first flow, also one made while a reload turned
// kv_tokens off: once they count again, as many passes are allowed.
func init() {
	cases = append(cases, testCase{"TokensPassesCountAgainAfterAGrantWithoutTokens", tokensPassesReload})
}

func tokensPassesReload(t *testing.T, h Harness) {
	s := store(t, h, "passes-reload", "n1")
	in, ok := s.(fairqueue.Inspector)
	if !ok {
		t.Skip("the store has no Inspect")
	}
	counted := fairqueue.Limits{Permits: 1, Lease: time.Minute, Tokens: 4, TokenBound: 8}
	off := fairqueue.Limits{Permits: 1, Lease: time.Minute}
	heavy, light := fairqueue.TenantKey("heavy")+".0", fairqueue.TenantKey("light")+".0"
	n := 0
	acquire := func(flow string, tokens int) string {
		n++
		id := fmt.Sprintf("n1:%d:%s", n, flow)
		_, err := s.Acquire(bg, fairqueue.TicketArgs{ID: id, Node: "n1", Limits: counted, Cost: 1, Tokens: tokens})
		require.NoError(t, err)
		return id
	}
	holder := func() string {
		snap, err := in.Inspect(bg, 0, 0)
		require.NoError(t, err)
		if len(snap.Holders) == 0 {
			return ""
		}
		return snap.Holders[0].Ticket
	}
	release := func(l fairqueue.Limits) {
		require.NoError(t, s.Release(bg, fairqueue.TicketArgs{ID: holder(), Node: "n1", Limits: l}))
	}
	acquire(light, 0) // granted
	acquire(heavy, 8) // first in fair order, never fits 4 tokens
	for range 12 {
		acquire(light, 0)
	}
	for range fairqueue.TokenPasses - 1 {
		release(counted) // passes the heavy head
	}
	release(off) // tokens not counted: the heavy head, first, is served
	assert.Contains(t, holder(), heavy)
	acquire(heavy, 8) // first again (less usage), never fits
	for i := range 3 {
		release(counted)
		assert.Contains(t, holder(), light, "pass %d after the grant to the first flow", i+1)
	}
	require.NoError(t, s.Leave(bg, "n1", counted))
}
