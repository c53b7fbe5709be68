package redisstore_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
	"github.com/fair-queue/caddy-fair-queue/internal/redistest"
)

// countedReleases is heldTransfers that also counts the releases that
// went through the store.
type countedReleases struct {
	heldTransfers
	releases atomic.Int32
}

func (c *countedReleases) Release(ctx context.Context, t fairqueue.TicketArgs) error {
	c.releases.Add(1)
	return c.heldTransfers.Store.Release(ctx, t)
}

// countedNode is a node of queue name with permits whose store holds
// its transfers and counts its releases.
func countedNode(t *testing.T, name string, permits int) (*node, *countedReleases) {
	t.Helper()
	cr := &countedReleases{heldTransfers: heldTransfers{calls: make(chan string, 8), go_: make(chan struct{})}}
	n := wrappedNode(t, redistest.Start(t), name, fairqueue.Config{Permits: permits, MaxWait: 10 * time.Second, Lease: 3 * time.Second},
		func(s fairqueue.Store) fairqueue.Store { cr.Store = s; return cr })
	return n, cr
}

// Permits of one node that end back to back, before the store answers
// the first one's transfer, each hand on locally, to the node's waiters
// in queue order: none of them waits for a release's round trip. The
// store then counts the waiters as the holders, and numbers their
// grants in queue order.
func TestPermitsEndingBackToBackEachHandOnLocally(t *testing.T) {
	const name = "backtoback"
	n, cr := countedNode(t, name, 2)
	ctx := context.Background()
	var holders []*fairqueue.Permit
	for range 2 {
		p, err := n.q.Acquire(ctx, fairqueue.Request{})
		require.NoError(t, err)
		holders = append(holders, p)
	}
	var waiters []chan got
	var ids []string
	for range 4 {
		ch, id := queueWaiter(t, n, name)
		waiters, ids = append(waiters, ch), append(ids, id)
	}
	alive(t, n)
	// A first release goes through the store: its reply names the
	// node's waiters at the head.
	holders[0].Release()
	w0 := <-waiters[0]
	require.NoError(t, w0.err)
	require.Equal(t, int32(1), cr.releases.Load())

	// The second holder's permit hands on locally; its transfer is held.
	go holders[1].Release()
	select {
	case to := <-cr.calls:
		assert.Equal(t, ids[1], to)
	case <-time.After(5 * time.Second):
		t.Fatal("no local handoff")
	}
	w1 := <-waiters[1]
	require.NoError(t, w1.err)
	// The first waiter's permit ends while that transfer is on its way:
	// it hands on locally too, to the next waiter.
	go w0.p.Release()
	var w2 got
	select {
	case w2 = <-waiters[2]:
		require.NoError(t, w2.err)
	case <-time.After(5 * time.Second):
		t.Fatalf("the next waiter was not started; releases through the store: %d", cr.releases.Load())
	}
	assert.Equal(t, int32(1), cr.releases.Load(), "releases through the store")
	st := readState(t, n.rdb, name)
	assert.ElementsMatch(t, []string{holders[1].Ticket(), w0.p.Ticket()}, st.Holders,
		"until the store hears of them, the old holders count")

	// The transfers go one after the other, in queue order.
	for i := 1; i <= 2; i++ {
		if i > 1 {
			select {
			case to := <-cr.calls:
				assert.Equal(t, ids[i], to)
			case <-time.After(5 * time.Second):
				t.Fatalf("transfer %d not sent", i)
			}
		}
		cr.go_ <- struct{}{}
	}
	eventually(t, 5*time.Second, func() bool {
		st := readState(t, n.rdb, name)
		return len(st.Holders) == 2 && st.Holders[0] != holders[1].Ticket() && st.Holders[1] != holders[1].Ticket() &&
			st.Holders[0] != w0.p.Ticket() && st.Holders[1] != w0.p.Ticket()
	}, "the waiters hold the permits in the store")
	st = readState(t, n.rdb, name)
	assert.ElementsMatch(t, []string{w1.p.Ticket(), w2.p.Ticket()}, st.Holders)
	assert.Equal(t, []string{ids[3]}, st.Waiting)
	eventually(t, 5*time.Second, func() bool { return w2.p.GrantNo() != 0 }, "the grant number of the last")
	assert.Less(t, w0.p.GrantNo(), w1.p.GrantNo(), "granted in order")
	assert.Less(t, w1.p.GrantNo(), w2.p.GrantNo(), "granted in order")
	select {
	case r := <-waiters[3]:
		t.Fatalf("the last waiter got in beside the two: %v", r)
	case <-time.After(100 * time.Millisecond):
	}
	// Let the rest through.
	stop := make(chan struct{})
	defer close(stop)
	go func() {
		for {
			select {
			case <-cr.calls:
				cr.go_ <- struct{}{}
			case <-stop:
				return
			}
		}
	}()
	w1.p.Release()
	w3 := <-waiters[3]
	require.NoError(t, w3.err)
	w2.p.Release()
	w3.p.Release()
	eventually(t, 5*time.Second, func() bool { return len(readState(t, n.rdb, name).Holders) == 0 }, "every permit released")
}

// A release names the node's waiters at the head of the queue, up to
// twice the permits in a row, while the node is alone in the queue; with
// another node there it names the first only (the other's releases
// grant from the head as well).
func TestReleaseNamesTheNodesWaitersInARowWhileItIsAlone(t *testing.T) {
	ctx := context.Background()
	rdb := redistest.Start(t).Client(t)
	s1, h1 := openHeads(t, rdb, "inarow", "n1")
	s2, _ := openHeads(t, rdb, "inarow", "n2")
	l := fairqueue.Limits{Permits: 2, Lease: 10 * time.Second}
	tk := func(id string) fairqueue.TicketArgs { return ticketOf(id, l) }
	for _, id := range []string{"n1:1", "n1:2", "n1:3", "n1:4", "n1:5", "n1:6", "n1:7", "n1:8"} {
		_, err := s1.Acquire(ctx, tk(id))
		require.NoError(t, err)
	}
	require.NoError(t, s1.Release(ctx, tk("n1:1")))
	head, grants := h1.last()
	assert.Equal(t, []string{"n1:3"}, grants)
	assert.Equal(t, "n1:4 n1:5 n1:6 n1:7", head, "alone: the first ones, twice as many as the permits")

	_, err := s2.Acquire(ctx, tk("n2:7"))
	require.NoError(t, err)
	require.NoError(t, s1.Release(ctx, tk("n1:2")))
	head, _ = h1.last()
	assert.Equal(t, "n1:5", head, "with another node: the first only")
}

// A waiter started by a local handoff whose request ends before its
// transfer is sent hands its permit on locally too; the transfer that
// then counts it as a holder in the store is followed by the one that
// takes its entry out, and no release goes through the store for it.
func TestAWaiterEndingBeforeItsTransferIsSentCostsNoRelease(t *testing.T) {
	const name = "endsfirst"
	n, cr := countedNode(t, name, 1)
	ctx := context.Background()
	h, err := n.q.Acquire(ctx, fairqueue.Request{})
	require.NoError(t, err)
	var waiters []chan got
	var ids []string
	for range 3 {
		ch, id := queueWaiter(t, n, name)
		waiters, ids = append(waiters, ch), append(ids, id)
	}
	alive(t, n)
	h.Release() // through the store: its reply names waiters 1 and 2
	w0 := <-waiters[0]
	require.NoError(t, w0.err)
	go w0.p.Release()
	require.Equal(t, ids[1], <-cr.calls)
	w1 := <-waiters[1]
	require.NoError(t, w1.err)
	w1.p.Release() // before its transfer is sent: queued behind w0's
	w2 := <-waiters[2]
	require.NoError(t, w2.err)
	cr.go_ <- struct{}{}
	require.Equal(t, ids[2], <-cr.calls)
	cr.go_ <- struct{}{}
	eventually(t, 5*time.Second, func() bool {
		st := readState(t, n.rdb, name)
		return len(st.Holders) == 1 && st.Holders[0] == w2.p.Ticket() && len(st.Waiting) == 0
	}, "the last waiter holds the permit")
	time.Sleep(100 * time.Millisecond) // a release of w1 would be on its way
	assert.Equal(t, int32(1), cr.releases.Load(), "releases through the store")
	assert.Equal(t, []string{w2.p.Ticket()}, readState(t, n.rdb, name).Holders)
	w2.p.Release()
	eventually(t, 5*time.Second, func() bool { return len(readState(t, n.rdb, name).Holders) == 0 }, "released")
}
