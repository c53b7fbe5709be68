package storetest

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
)

// The count of the grants that passed a fair waiter of a node without
// the pool starts again at every grant that passes nobody, whichever
// node makes it: also one made by the node without the pool itself
// (its release hands its permit on with no pool in its limits).
func init() {
	cases = append(cases,
		testCase{"FairBarePassesStartAgainAtAGrantOfTheNodeWithoutThePool", bareFairResetByBare},
		testCase{"FairBarePassesForgottenWhenEveryNodeLeft", bareFairForgottenAfterLeave},
	)
}

// n1 has the pool (a with 2 permits, b with 1), n2 not (1 permit, the
// smallest upstream's). n2's request y0 runs anywhere: b is full, a has
// one free permit. n2's waiter y1, first in fair order, is passed by
// tenant z's waiters on a fairqueue.TokenPasses times; then n2's release
// of y0 grants y1, passing nobody: the count starts again, and n2's next
// waiter y2, first in fair order while y1 keeps b full, is passed again
// by z's next waiter on a.
func bareFairResetByBare(t *testing.T, h Harness) {
	b := newBareFairWith(t, h, "barefairreset",
		fairqueue.Limits{Permits: 3, Lease: time.Minute,
			Upstreams: []fairqueue.Upstream{{Dial: "a:1", Permits: 2}, {Dial: "b:1", Permits: 1}}},
		fairqueue.Limits{Permits: 1, Lease: time.Minute})
	y0 := b.ticket("n2", "y")
	ok, _ := b.acquire(t, y0)
	require.True(t, ok, "n2's first request: the fast path")
	z0 := b.ticket("n1", "z")
	z0.Cost = 3 // z's usage above y's: y's flow comes first
	ok, up := b.acquire(t, z0)
	require.True(t, ok)
	require.Equal(t, "a:1", up)
	y1 := b.ticket("n2", "y")
	ok, _ = b.acquire(t, y1)
	require.False(t, ok)
	zs := b.queued(t, "n1", "z", fairqueue.TokenPasses+2)
	running := b.passes(t, z0, zs, func(r fairqueue.TicketArgs) map[string]string {
		return map[string]string{y0.ID: "", r.ID: "a:1"} // z's next waiter on a, past n2's
	})
	b.release(t, running)
	require.Equal(t, map[string]string{y0.ID: ""}, b.holders(t),
		"after %d passes a's free permit is kept for n2's waiter", fairqueue.TokenPasses)

	// n2 releases y0: its own dispatch, with no pool, grants y1, which
	// passes nobody.
	b.release(t, y0)
	require.Equal(t, map[string]string{y1.ID: ""}, b.holders(t), "n2's release grants its waiter, first in fair order")
	y2 := b.ticket("n2", "y")
	ok, _ = b.acquire(t, y2)
	require.False(t, ok)
	_, err := b.s1.Reconcile(bg, "n1", b.pool)
	require.NoError(t, err)
	assert.Equal(t, map[string]string{y1.ID: "", zs[fairqueue.TokenPasses].ID: "a:1"}, b.holders(t),
		"the grant of y1 passed nobody: z's next waiter passes n2's y2 on a again (the count started again)")

	for _, w := range zs[fairqueue.TokenPasses:] {
		require.NoError(t, b.store(w).Cancel(bg, w))
	}
	require.NoError(t, b.s2.Cancel(bg, y2))
	b.release(t, y1)
	b.leave(t)
}

// n2's waiter is passed fairqueue.TokenPasses times, then cancelled;
// every node leaves, and the queue, empty everywhere, forgets its state.
// Back again, n2's new waiter, first in fair order and not placeable, is
// passed by tenant z's waiter on b, as the first time: the count of
// passes went with the rest.
func bareFairForgottenAfterLeave(t *testing.T, h Harness) {
	b := newBareFair(t, h, "barefairleave")
	x := b.ticket("n1", "x")
	ok, _ := b.acquire(t, x)
	require.True(t, ok)
	z := b.ticket("n1", "z")
	ok, _ = b.acquire(t, z)
	require.True(t, ok)
	y := b.ticket("n2", "y")
	ok, _ = b.acquire(t, y)
	require.False(t, ok)
	zs := b.queued(t, "n1", "z", fairqueue.TokenPasses+1)
	running := b.passes(t, z, zs, nil)
	b.release(t, running)
	require.Equal(t, map[string]string{x.ID: "a:1"}, b.holders(t),
		"after %d passes b is kept for n2's waiter", fairqueue.TokenPasses)
	require.NoError(t, b.s2.Cancel(bg, y))
	require.NoError(t, b.s1.Cancel(bg, zs[fairqueue.TokenPasses]))
	b.release(t, x)
	b.leave(t)

	// Back: the same rolling change, on a queue that starts afresh (new
	// nodes: those that left are gone for their tombstone's life).
	c := &bareFair{s1: store(t, h, "barefairleave", "n3"), s2: store(t, h, "barefairleave", "n4"),
		in: b.in, pool: b.pool, plain: b.plain, n: b.n}
	_, err := c.s1.Heartbeat(bg, fairqueue.HeartbeatArgs{Node: "n3", Limits: c.pool, Beat: 1})
	require.NoError(t, err)
	_, err = c.s2.Heartbeat(bg, fairqueue.HeartbeatArgs{Node: "n4", Limits: c.plain, Beat: 1})
	require.NoError(t, err)
	on := func(node, tenant string, l fairqueue.Limits) fairqueue.TicketArgs {
		c.n++
		return fairqueue.TicketArgs{ID: fmt.Sprintf("%s:%d:%s.0", node, c.n, fairqueue.TenantKey(tenant)),
			Node: node, Limits: l, Cost: 1}
	}
	x2 := on("n3", "x", c.pool)
	r, err := c.s1.Acquire(bg, x2)
	require.NoError(t, err)
	require.True(t, r.Granted)
	require.Equal(t, "a:1", r.Upstream)
	y2 := on("n4", "y", c.plain)
	r, err = c.s2.Acquire(bg, y2)
	require.NoError(t, err)
	require.False(t, r.Granted)
	z2 := on("n3", "z", c.pool)
	r, err = c.s1.Acquire(bg, z2)
	require.NoError(t, err)
	if !r.Granted {
		_, err = c.s1.Reconcile(bg, "n3", c.pool)
		require.NoError(t, err)
	}
	assert.Equal(t, map[string]string{x2.ID: "a:1", z2.ID: "b:1"}, c.holders(t),
		"z's waiter passes n4's on b, as on a queue never used: the passes of before the leave are forgotten")
	if _, granted := c.holders(t)[z2.ID]; granted {
		require.NoError(t, c.s1.Release(bg, z2))
	} else {
		require.NoError(t, c.s1.Cancel(bg, z2))
	}
	require.NoError(t, c.s2.Cancel(bg, y2))
	require.NoError(t, c.s1.Release(bg, x2))
	require.NoError(t, c.s1.Leave(bg, "n3", c.pool))
	require.NoError(t, c.s2.Leave(bg, "n4", c.plain))
}
