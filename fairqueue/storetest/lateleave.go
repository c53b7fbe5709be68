package storetest

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
)

// Calls of a node that reach the store after the node's leave: the
// node's client gave up on them (a timeout: a slow network, a frozen
// Redis that thaws later) and went on to leave. The leave gave back
// every permit of the node; a late call counts none again for nobody,
// brings the node back to life for nobody, and leaves the other nodes
// their permits; the last node's leave then still leaves nothing.
func init() {
	cases = append(cases,
		testCase{"HeartbeatAfterTheNodesLeaveCountsNothing", lateHeartbeat},
		testCase{"AcquireAfterTheNodesLeaveTakesNothing", lateAcquire},
		testCase{"RequeueAfterTheNodesLeaveTakesNothing", lateRequeue},
		testCase{"TransferAfterTheNodesLeaveTakesNothing", lateTransfer},
	)
}

// lateLeft starts nodes a (one permit held, a:1) and b (one permit held,
// b:1) on queue name with 2 permits, and has a leave. It returns b's
// handle and the limits.
func lateLeft(t *testing.T, h Harness, name string, before func(a fairqueue.Store, l fairqueue.Limits)) (a, b fairqueue.Store, l fairqueue.Limits) {
	t.Helper()
	l = fairqueue.Limits{Permits: 2, Lease: time.Minute}
	a, b = store(t, h, name, "a"), store(t, h, name, "b")
	for _, tk := range []fairqueue.TicketArgs{ticket("a:1", "a", l), ticket("b:1", "b", l)} {
		res, err := map[string]fairqueue.Store{"a": a, "b": b}[tk.Node].Acquire(bg, tk)
		require.NoError(t, err)
		require.True(t, res.Granted)
	}
	_, err := a.Heartbeat(bg, fairqueue.HeartbeatArgs{Node: "a", Limits: l, Held: []string{"a:1"}, Beat: 1})
	require.NoError(t, err)
	if before != nil {
		before(a, l)
	}
	require.NoError(t, a.Leave(bg, "a", l))
	return a, b, l
}

// lateChecks asserts what a late call of a must not change: b holds its
// permit alone, gets the other at once, sees one live node, and its
// leave, the last, leaves nothing.
func lateChecks(t *testing.T, h Harness, name string, b fairqueue.Store, l fairqueue.Limits, what string) {
	t.Helper()
	_, holders := h.State(t, name)
	assert.Equal(t, []string{"b:1"}, holders, "a %s that reached the store after its node's leave counted a permit for nobody", what)
	res, err := b.Acquire(bg, ticket("b:2", "b", l))
	require.NoError(t, err)
	assert.True(t, res.Granted, "b did not get the permit a gave back: a late %s of a counts it", what)
	hb, err := b.Heartbeat(bg, fairqueue.HeartbeatArgs{Node: "b", Limits: l, Held: []string{"b:1", "b:2"}, Beat: 1})
	require.NoError(t, err)
	assert.Equal(t, 1, hb.Cluster.Nodes, "a late %s brought the node that left back to life", what)
	require.NoError(t, b.Leave(bg, "b", l))
	waiting, holders := h.State(t, name)
	assert.Empty(t, waiting, "left after the last leave")
	assert.Empty(t, holders, "left after the last leave")
}

// A heartbeat that names a held permit and a permit to adopt (admitted
// while the store was unreachable) reaches the store after its node's
// leave: it counts neither.
func lateHeartbeat(t *testing.T, h Harness) {
	const name = "lateheartbeat"
	a, b, l := lateLeft(t, h, name, nil)
	_, err := a.Heartbeat(bg, fairqueue.HeartbeatArgs{Node: "a", Limits: l, Beat: 2,
		Held: []string{"a:1"}, Adopt: []string{"a:2"}})
	require.NoError(t, err)
	lateChecks(t, h, name, b, l, "heartbeat")
}

// An acquire whose call timed out on the node's side, its cancel lost,
// reaches the store after its node's leave: it is not granted, nor left
// waiting.
func lateAcquire(t *testing.T, h Harness) {
	const name = "lateacquire"
	a, b, l := lateLeft(t, h, name, nil)
	res, err := a.Acquire(bg, ticket("a:2", "a", l))
	require.NoError(t, err)
	assert.False(t, res.Granted, "an acquire of a node that left was granted")
	lateChecks(t, h, name, b, l, "acquire")
}

// A requeue of a's permit a:1 reaches the store after its node's leave
// (which released a:1): its new ticket is not queued nor granted.
func lateRequeue(t *testing.T, h Harness) {
	const name = "laterequeue"
	a, b, l := lateLeft(t, h, name, nil)
	_, err := a.Requeue(bg, fairqueue.RequeueArgs{TicketArgs: ticket("a:2", "a", l), Old: "a:1", Seq: 1})
	require.NoError(t, err)
	lateChecks(t, h, name, b, l, "requeue")
}

// A local handoff of a (its permit a:1 to its waiter a:2) reaches the
// store after its node's leave: a:2 is not counted as a holder.
func lateTransfer(t *testing.T, h Harness) {
	const name = "latetransfer"
	var tr fairqueue.Transferrer
	a, b, l := lateLeft(t, h, name, func(a fairqueue.Store, l fairqueue.Limits) {
		var ok bool
		if tr, ok = a.(fairqueue.Transferrer); !ok {
			t.Skip("the store has no Transfer")
		}
		res, err := a.Acquire(bg, ticket("a:2", "a", l))
		require.NoError(t, err)
		require.False(t, res.Granted)
	})
	_ = a
	mv := ticket("a:1", "a", l)
	mv.Tombstone = true
	require.NoError(t, tr.Transfer(bg, mv, "a:2"))
	lateChecks(t, h, name, b, l, "transfer")
}
