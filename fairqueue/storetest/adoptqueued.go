package storetest

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
)

func init() {
	cases = append(cases,
		testCase{"AdoptedTicketStillQueuedLeavesTheFairQueue", adoptedQueued},
	)
}

// A heartbeat adopts (or counts again as held) a fair ticket the store
// still has queued: its acquire reached the store, its answer did not,
// and the node ran it anyway (on_store_error), or a local handoff's
// transfer was lost. The ticket runs once: it leaves the queue, counts
// for its flow, and is never granted again, not even after it ended;
// the waiters behind it are served in fair order, and nothing is left
// once every permit ended and the node left.
func adoptedQueued(t *testing.T, h Harness) {
	const name = "adoptqueued"
	s := store(t, h, name, "n1")
	l := fairqueue.Limits{Permits: 1, Lease: time.Minute}
	a1, a2, b3, a4, b5 := fairT(1, "aaaa.0", l), fairT(2, "aaaa.0", l), fairT(3, "bbbb.0", l), fairT(4, "aaaa.0", l), fairT(5, "bbbb.0", l)
	mustAcquire(t, s, a1, true)
	for _, w := range []fairqueue.TicketArgs{a2, b3, a4, b5} {
		mustAcquire(t, s, w, false)
	}
	_, err := s.Heartbeat(bg, fairqueue.HeartbeatArgs{Node: "n1", Limits: l, Beat: 1,
		Held: []string{a1.ID}, Adopt: []string{a2.ID}})
	require.NoError(t, err)
	waiting, holders := h.State(t, name)
	assert.ElementsMatch(t, []string{a1.ID, a2.ID}, holders, "the adopted ticket holds a permit")
	assert.ElementsMatch(t, []string{b3.ID, a4.ID, b5.ID}, waiting, "the adopted ticket left the queue")
	if ins, ok := s.(fairqueue.Inspector); ok {
		snap, err := ins.Inspect(bg, 0, 10)
		require.NoError(t, err)
		assert.Equal(t, 3, snap.Waiting, "the adopted ticket no longer counts as waiting")
	}
	res, err := s.Acquire(bg, a2)
	require.NoError(t, err)
	assert.True(t, res.Granted, "an acquire of the adopted ticket sent again finds it holding")

	// a1 ends: the adopted a2 holds the one permit; nothing is granted.
	require.NoError(t, s.Release(bg, a1))
	_, holders = h.State(t, name)
	assert.Equal(t, []string{a2.ID}, holders)
	// Then in fair order: b (counter 1, head b3) before a (counter 1,
	// head a4, arrived later); a2 is not granted again after it ended.
	want := []fairqueue.TicketArgs{b3, a4, b5}
	prev := a2
	for _, w := range want {
		require.NoError(t, s.Release(bg, prev))
		_, holders = h.State(t, name)
		require.Equal(t, []string{w.ID}, holders, "granted after %s ended", prev.ID)
		prev = w
	}
	require.NoError(t, s.Release(bg, prev))
	require.NoError(t, s.Leave(bg, "n1", l))
	waiting, holders = h.State(t, name)
	assert.Empty(t, waiting, "left after the last leave")
	assert.Empty(t, holders, "left after the last leave")
}
