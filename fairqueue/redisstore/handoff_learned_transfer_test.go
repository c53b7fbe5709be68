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

// A local handoff reads the settings (its release's), starts the waiter,
// and then sends its transfer, whose reply names the next heads. A reload
// that turns a learned capacity on may land between the two, its share in
// Redis (another node learnt it) while the node knows none: the transfer
// goes out after the reload under the settings before it, and Redis names
// the heads under all the permits. The node must not take them for heads
// chosen under the settings in force, though the call was sent after the
// reload: it would start one more waiter above the learned permits,
// which Redis' own dispatch keeps to from the reload on.
func TestLocalHandoffKeepsToALearnedCapacityAReloadTurnedOnWhileItsTransferWasOnItsWay(t *testing.T) {
	longHeads(t) // the heads, if taken, still serve when the test hands on
	const name = "learnedtransferreload"
	srv := redistest.Start(t)
	learned := learnedCfg(10*time.Second, 3*time.Second)
	plain := learned
	plain.Adaptive = nil
	ts := &heldTransferStore{entered: make(chan struct{}), let: make(chan struct{})}
	a := wrappedNode(t, srv, name, plain, func(s fairqueue.Store) fairqueue.Store { ts.Store = s; return ts })
	held := holdFour(t, a)
	// b, with the learned capacity, halves the share and leaves: the
	// share stays in Redis.
	b := joinAndLower(t, srv, name, learned)
	require.Equal(t, 0.5, b.q.Share())
	require.NoError(t, b.q.Close())
	w1Ch, _ := queueWaiter(t, a, name)
	w2Ch, _ := queueWaiter(t, a, name)
	w3Ch, w3 := queueWaiter(t, a, name)
	aloneSince(t, a, time.Now())

	held[0].Release() // through Redis: w1 starts, and the reply names w2 and w3 the heads
	w1 := <-w1Ch
	require.NoError(t, w1.err)
	require.True(t, a.q.HeadIsOwn(), "the release's reply named no heads")
	ts.hold.Store(true) // the next transfer waits on its way
	released := make(chan struct{})
	go func() { held[1].Release(); close(released) }() // a local handoff: w2 starts
	w2 := <-w2Ch
	require.NoError(t, w2.err)
	select {
	case <-ts.entered:
	case <-time.After(30 * time.Second):
		t.Fatal("the local handoff sent no transfer")
	}
	reloaded := time.Now()
	require.NoError(t, a.q.Reconfigure(learned)) // a reload: 4 x 0.5 = 2 permits from now on
	close(ts.let)                                // the transfer goes, under the settings before the reload
	<-released
	// A reconcile of a sent before the reload, which grants under all the
	// permits, lands before the release below.
	beatAfter(t, a, reloaded)

	held[2].Release() // 3 still run (held[3], w1, w2): nothing more may start
	st := readState(t, a.rdb, name)
	assert.NotContains(t, st.Holders, w3, "w3 started with 3 running under a learned capacity of 2 (4 x 0.5)")
	assert.Len(t, st.Holders, 3)
	w1.p.Release()
	w2.p.Release()
	held[3].Release()
	got := <-w3Ch
	require.NoError(t, got.err)
	got.p.Release()
}

// heldTransferStore is a Store whose Transfer, once hold is set, waits
// until let is closed before it goes to Redis (entered is closed as it
// begins to wait), as if the goroutine that sends it had been
// descheduled. It takes learned capacities (Adapter).
type heldTransferStore struct {
	fairqueue.Store
	hold    atomic.Bool
	entered chan struct{}
	let     chan struct{}
}

func (s *heldTransferStore) Transfer(ctx context.Context, t fairqueue.TicketArgs, to string) error {
	if s.hold.CompareAndSwap(true, false) {
		close(s.entered)
		<-s.let
	}
	return s.Store.(fairqueue.Transferrer).Transfer(ctx, t, to)
}

func (s *heldTransferStore) Adapt(ctx context.Context, a fairqueue.AdaptArgs) (map[string]float64, error) {
	return s.Store.(fairqueue.Adapter).Adapt(ctx, a)
}
