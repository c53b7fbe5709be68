package storetest

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
)

// A rolling change that adds a pool, in a fair queue: node n1 has the
// pool (upstreams a and b, one permit each), node n2 not yet (1 permit,
// no more than the smallest upstream's, as docs/pools.md advises). n2's
// waiter, first in fair order, is granted by n1 only once every
// upstream has room (it may run on either); meanwhile another tenant's
// waiter is served on an upstream with room, past it, at most
// fairqueue.TokenPasses grants in a row: then room is kept for it.
func init() {
	cases = append(cases,
		testCase{"FairWaiterOfANodeWithoutThePoolLetsOthersPass", bareFairPassed},
		testCase{"FairWaiterOfANodeWithoutThePoolIsPassedAtMostTokenPassesTimes", bareFairBounded},
	)
}

// bareFair is the two nodes of a rolling change that adds a pool, on one
// fair queue: n1 with the pool, n2 without (heartbeats naming each).
type bareFair struct {
	s1, s2      fairqueue.Store
	in          fairqueue.Inspector
	pool, plain fairqueue.Limits
	n           int
}

func newBareFair(t *testing.T, h Harness, name string) *bareFair {
	t.Helper()
	return newBareFairWith(t, h, name, fairqueue.Limits{Permits: 2, Lease: time.Minute,
		Upstreams: []fairqueue.Upstream{{Dial: "a:1", Permits: 1}, {Dial: "b:1", Permits: 1}}},
		fairqueue.Limits{Permits: 1, Lease: time.Minute})
}

// newBareFairWith is newBareFair with n1's limits pool and n2's plain.
func newBareFairWith(t *testing.T, h Harness, name string, pool, plain fairqueue.Limits) *bareFair {
	t.Helper()
	b := &bareFair{s1: store(t, h, name, "n1"), s2: store(t, h, name, "n2"), pool: pool, plain: plain}
	in, ok := b.s1.(fairqueue.Inspector)
	if !ok {
		t.Skip("the store has no Inspect")
	}
	b.in = in
	_, err := b.s1.Heartbeat(bg, fairqueue.HeartbeatArgs{Node: "n1", Limits: b.pool, Beat: 1})
	require.NoError(t, err)
	_, err = b.s2.Heartbeat(bg, fairqueue.HeartbeatArgs{Node: "n2", Limits: b.plain, Beat: 1})
	require.NoError(t, err)
	return b
}

// ticket is a new ticket of node ("n1" with the pool, "n2" without) in
// tenant's band 0.
func (b *bareFair) ticket(node, tenant string) fairqueue.TicketArgs {
	b.n++
	l := b.pool
	if node == "n2" {
		l = b.plain
	}
	return fairqueue.TicketArgs{ID: fmt.Sprintf("%s:%d:%s.0", node, b.n, fairqueue.TenantKey(tenant)),
		Node: node, Limits: l, Cost: 1}
}

func (b *bareFair) store(a fairqueue.TicketArgs) fairqueue.Store {
	if a.Node == "n2" {
		return b.s2
	}
	return b.s1
}

// acquire acquires a on its node's handle; granted is whether it was.
func (b *bareFair) acquire(t *testing.T, a fairqueue.TicketArgs) (granted bool, upstream string) {
	t.Helper()
	r, err := b.store(a).Acquire(bg, a)
	require.NoError(t, err)
	return r.Granted, r.Upstream
}

func (b *bareFair) release(t *testing.T, a fairqueue.TicketArgs) {
	t.Helper()
	require.NoError(t, b.store(a).Release(bg, a))
}

// holders maps each holder to its upstream ("" for none).
func (b *bareFair) holders(t *testing.T) map[string]string {
	t.Helper()
	snap, err := b.in.Inspect(bg, 0, 0)
	require.NoError(t, err)
	out := map[string]string{}
	for _, h := range snap.Holders {
		out[h.Ticket] = h.Upstream
	}
	return out
}

// leave ends both nodes.
// queued queues k waiters of tenant on node, each refused at once.
func (b *bareFair) queued(t *testing.T, node, tenant string, k int) []fairqueue.TicketArgs {
	ws := make([]fairqueue.TicketArgs, 0, k)
	for range k {
		ws = append(ws, b.ticket(node, tenant))
		ok, _ := b.acquire(t, ws[len(ws)-1])
		require.False(t, ok)
	}
	return ws
}

// passes releases running, then each of the first TokenPasses of ws in
// turn, each granted past a waiter that cannot be placed; after each
// release the holders are want(the one now running), where want is not
// nil. It returns the last one running.
func (b *bareFair) passes(t *testing.T, running fairqueue.TicketArgs, ws []fairqueue.TicketArgs,
	want func(running fairqueue.TicketArgs) map[string]string) fairqueue.TicketArgs {
	for i := range fairqueue.TokenPasses {
		b.release(t, running)
		running = ws[i]
		if want != nil {
			require.Equal(t, want(running), b.holders(t), "pass %d: the next waiter granted past the one that cannot be placed", i+1)
		}
	}
	return running
}

func (b *bareFair) leave(t *testing.T) {
	t.Helper()
	require.NoError(t, b.s1.Leave(bg, "n1", b.pool))
	require.NoError(t, b.s2.Leave(bg, "n2", b.plain))
}

// n2's waiter, first in fair order, cannot be placed while a runs n1's
// request; tenant z's waiter, behind it, is granted on b, which has
// room: it used to wait, the whole queue stalled until both upstreams
// had room. n2's waiter is granted once both have.
func bareFairPassed(t *testing.T, h Harness) {
	b := newBareFair(t, h, "barefair")
	x := b.ticket("n1", "x")
	ok, up := b.acquire(t, x)
	require.True(t, ok)
	require.Equal(t, "a:1", up)
	y := b.ticket("n2", "y")
	ok, _ = b.acquire(t, y)
	require.False(t, ok, "n2 runs 1 permit: its own waits")
	z := b.ticket("n1", "z")
	ok, _ = b.acquire(t, z)
	require.False(t, ok, "z arrives behind y's waiter")
	_, err := b.s1.Reconcile(bg, "n1", b.pool)
	require.NoError(t, err)
	assert.Equal(t, map[string]string{x.ID: "a:1", z.ID: "b:1"}, b.holders(t),
		"z's waiter waits behind n2's, which cannot be placed, while b has room")

	// a's request ends: b runs z's (if granted), n2's waiter still
	// cannot be placed.
	b.release(t, x)
	if _, granted := b.holders(t)[z.ID]; granted {
		assert.Equal(t, map[string]string{z.ID: "b:1"}, b.holders(t), "n2's waiter granted while b runs z's request")
		b.release(t, z)
	}
	assert.Equal(t, map[string]string{y.ID: ""}, b.holders(t), "n2's waiter granted, on no upstream, once both have room")
	z2 := b.ticket("n1", "z")
	ok, up = b.acquire(t, z2)
	assert.False(t, ok, "n1 granted %q beside n2's request, which may run on a or b", up)
	require.NoError(t, b.s1.Cancel(bg, z2))
	b.release(t, y)
	b.leave(t)
}

// n2's waiter, first in fair order, while a runs x's request for long:
// tenant z's waiters pass it on b, fairqueue.TokenPasses of them, then b
// is kept free for it; once a's request ends it is granted.
func bareFairBounded(t *testing.T, h Harness) {
	b := newBareFair(t, h, "barefairbound")
	x := b.ticket("n1", "x")
	ok, _ := b.acquire(t, x)
	require.True(t, ok)
	z := b.ticket("n1", "z")
	ok, up := b.acquire(t, z)
	require.True(t, ok)
	require.Equal(t, "b:1", up)
	y := b.ticket("n2", "y")
	ok, _ = b.acquire(t, y)
	require.False(t, ok)
	zs := b.queued(t, "n1", "z", fairqueue.TokenPasses+2)
	running := b.passes(t, z, zs, func(r fairqueue.TicketArgs) map[string]string {
		return map[string]string{x.ID: "a:1", r.ID: "b:1"} // z's next waiter on b, past n2's
	})
	b.release(t, running)
	assert.Equal(t, map[string]string{x.ID: "a:1"}, b.holders(t),
		"after %d passes b is kept for n2's waiter", fairqueue.TokenPasses)
	b.release(t, x)
	assert.Equal(t, map[string]string{y.ID: ""}, b.holders(t), "n2's waiter granted once both upstreams have room")
	for _, w := range zs[fairqueue.TokenPasses:] {
		require.NoError(t, b.s1.Cancel(bg, w))
	}
	b.release(t, y)
	b.leave(t)
}
