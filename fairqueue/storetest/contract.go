package storetest

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
)

// Cases that drive the Store contract directly (Harness.Store), for what
// a Queue makes rare: re-sent heartbeats, lost waiters, rolling changes.
func init() {
	cases = append(cases,
		testCase{"JoinHeartbeatReAddsNothingAndASentAgainOneSaysRejoinedToo", joinHeartbeat},
		testCase{"HeartbeatNamesThePendingTicketsTheStoreLost", missingPending},
		testCase{"GrantToAnotherNodesWaiterLastsTheOwnersLease", ownersLease},
		testCase{"LeaveReleasesPermitsOfAnEarlierLongerLease", leaveLongerLease},
		testCase{"HeartbeatOnItsWayCountsNoPermitReleasedMeanwhile", releasedMeanwhile},
	)
}

// store opens a handle on queue name as node (nil when the harness has
// no Store: the case is skipped).
func store(t *testing.T, h Harness, name, node string) fairqueue.Store {
	t.Helper()
	if h.Store == nil {
		t.Skip("the harness drives no Store directly")
	}
	s := h.Store(t, name)
	require.NoError(t, s.Open(bg, node, nopListener{}))
	t.Cleanup(func() { _ = s.Close() })
	return s
}

type nopListener struct{}

func (nopListener) Granted(...fairqueue.Grant) {}
func (nopListener) Resynced()                  {}

func ticket(id, node string, l fairqueue.Limits) fairqueue.TicketArgs {
	return fairqueue.TicketArgs{ID: id, Node: node, Limits: l}
}

// A node's first heartbeat after the acquire that brought it in is its
// join: it re-adds nothing (it might be one delayed past the node's
// leave) and says rejoined, also when the client sends it again (same
// number). The next heartbeat counts again a held ticket the store lacks.
func joinHeartbeat(t *testing.T, h Harness) {
	s := store(t, h, "join", "n1")
	l := fairqueue.Limits{Permits: 2, Lease: time.Minute}
	res, err := s.Acquire(bg, ticket("n1:1", "n1", l))
	require.NoError(t, err)
	require.True(t, res.Granted)
	held := []string{"n1:1", "n1:2"}
	for range 2 {
		hb, err := s.Heartbeat(bg, fairqueue.HeartbeatArgs{Node: "n1", Limits: l, Held: held, Beat: 1})
		require.NoError(t, err)
		assert.True(t, hb.Rejoined, "the join, or the join sent again")
		assert.Empty(t, hb.Readded)
	}
	hb, err := s.Heartbeat(bg, fairqueue.HeartbeatArgs{Node: "n1", Limits: l, Held: held, Beat: 2})
	require.NoError(t, err)
	assert.False(t, hb.Rejoined)
	assert.Equal(t, []string{"n1:2"}, hb.Readded, "only the ticket whose entry was missing")
	assert.Equal(t, 2, hb.Cluster.Holders)
	require.NoError(t, s.Leave(bg, "n1", l))
}

// The pending tickets a heartbeat names that the store has neither queued
// nor granted come back as missing.
func missingPending(t *testing.T, h Harness) {
	s := store(t, h, "missing", "n1")
	l := fairqueue.Limits{Permits: 1, Lease: time.Minute}
	for _, id := range []string{"n1:1", "n1:2"} {
		_, err := s.Acquire(bg, ticket(id, "n1", l))
		require.NoError(t, err)
	}
	hb, err := s.Heartbeat(bg, fairqueue.HeartbeatArgs{Node: "n1", Limits: l, Beat: 1,
		Held: []string{"n1:1"}, Pending: []string{"n1:1", "n1:2", "n1:3"}})
	require.NoError(t, err)
	assert.Equal(t, []string{"n1:3"}, hb.Missing)
	require.NoError(t, s.Leave(bg, "n1", l))
}

// During a rolling change of lease, a permit one node hands to another
// node's waiter expires after the owner's lease, not the granter's.
func ownersLease(t *testing.T, h Harness) {
	short, long := fairqueue.Limits{Permits: 1, Lease: time.Second}, fairqueue.Limits{Permits: 1, Lease: time.Minute}
	a, b := store(t, h, "owner", "a"), store(t, h, "owner", "b")
	res, err := a.Acquire(bg, ticket("a:1", "a", short))
	require.NoError(t, err)
	require.True(t, res.Granted)
	res, err = b.Acquire(bg, ticket("b:1", "b", long))
	require.NoError(t, err)
	require.False(t, res.Granted)
	require.NoError(t, a.Release(bg, ticket("a:1", "a", short))) // grants b:1
	ins, ok := a.(fairqueue.Inspector)
	if !ok {
		t.Skip("the store has no Inspect")
	}
	snap, err := ins.Inspect(bg, 0, 0)
	require.NoError(t, err)
	require.Len(t, snap.Holders, 1)
	assert.Equal(t, "b:1", snap.Holders[0].Ticket)
	assert.Greater(t, snap.Holders[0].LeaseLeft, 30*time.Second, "granted with the granter's lease")
	require.NoError(t, b.Leave(bg, "b", long))
	require.NoError(t, a.Leave(bg, "a", short))
}

// The last leave finds every permit of the node, also one granted under
// a longer lease than the node has now.
func leaveLongerLease(t *testing.T, h Harness) {
	s := store(t, h, "longer", "n1")
	res, err := s.Acquire(bg, ticket("n1:1", "n1", fairqueue.Limits{Permits: 1, Lease: time.Minute}))
	require.NoError(t, err)
	require.True(t, res.Granted)
	require.NoError(t, s.Leave(bg, "n1", fairqueue.Limits{Permits: 1, Lease: 2 * time.Second}))
	waiting, holders := h.State(t, "longer")
	assert.Empty(t, waiting)
	assert.Empty(t, holders, "the leave missed a permit of the node")
}

// A heartbeat names the permits its node held when it was sent. A release
// the node sent after that (marked: TicketArgs.Tombstone) may reach the
// store first and hand the permit on; the heartbeat then must not count
// the released ticket again, or the store counts more holders than
// permits until the node releases it once more. The same for the holder
// of a local handoff (Transfer).
func releasedMeanwhile(t *testing.T, h Harness) {
	s := store(t, h, "meanwhile", "n1")
	l := fairqueue.Limits{Permits: 1, Lease: time.Minute}
	res, err := s.Acquire(bg, ticket("n1:1", "n1", l))
	require.NoError(t, err)
	require.True(t, res.Granted)
	_, err = s.Heartbeat(bg, fairqueue.HeartbeatArgs{Node: "n1", Limits: l, Held: []string{"n1:1"}, Beat: 1})
	require.NoError(t, err)
	res, err = s.Acquire(bg, ticket("n1:2", "n1", l))
	require.NoError(t, err)
	require.False(t, res.Granted)

	rel := ticket("n1:1", "n1", l)
	rel.Tombstone = true
	require.NoError(t, s.Release(bg, rel)) // grants n1:2
	hb, err := s.Heartbeat(bg, fairqueue.HeartbeatArgs{Node: "n1", Limits: l, Held: []string{"n1:1"}, Beat: 2})
	require.NoError(t, err)
	assert.Empty(t, hb.Readded, "a permit released after the heartbeat was sent")
	assert.Equal(t, 1, hb.Cluster.Holders)
	_, holders := h.State(t, "meanwhile")
	assert.Equal(t, []string{"n1:2"}, holders)

	if tr, ok := s.(fairqueue.Transferrer); ok {
		res, err = s.Acquire(bg, ticket("n1:3", "n1", l))
		require.NoError(t, err)
		require.False(t, res.Granted)
		mv := ticket("n1:2", "n1", l)
		mv.Tombstone = true
		require.NoError(t, tr.Transfer(bg, mv, "n1:3"))
		hb, err = s.Heartbeat(bg, fairqueue.HeartbeatArgs{Node: "n1", Limits: l, Held: []string{"n1:2"}, Beat: 3})
		require.NoError(t, err)
		assert.Empty(t, hb.Readded, "the holder of a local handoff made after the heartbeat was sent")
		assert.Equal(t, 1, hb.Cluster.Holders)
		_, holders = h.State(t, "meanwhile")
		assert.Equal(t, []string{"n1:3"}, holders)
	}
	require.NoError(t, s.Leave(bg, "n1", l))
	waiting, holders := h.State(t, "meanwhile")
	assert.Empty(t, waiting)
	assert.Empty(t, holders)
}
