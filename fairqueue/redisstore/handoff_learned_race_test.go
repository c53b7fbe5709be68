package redisstore_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
	"github.com/fair-queue/caddy-fair-queue/internal/redistest"
)

// A reply that names the heads may reach the node after the reply of
// its own report that lowered the share, though Redis chose them before
// (the two calls run on two connections; the goroutine that reads the
// first may be descheduled). The node must not take the heads for ones
// chosen under the share it knows now: it would start one on a permit
// that ends while more than the learned permits run.
func TestLocalHandoffKeepsToAShareLearnedWhileTheHeadsWereOnTheirWay(t *testing.T) {
	const name = "learnedcrossed"
	a, hs := heldHeadsNode(t, redistest.Start(t), name, learnedCfg(time.Second, 30*time.Second))
	held := holdFour(t, a)
	w1Ch, _ := queueWaiter(t, a, name)
	w2Ch, w2 := queueWaiter(t, a, name)
	alive(t, a)

	w1, arrive := headsOnTheirWay(t, hs, held, w1Ch)
	a.q.ObserveTTFT("", time.Second) // a breach: the share halves, 2 permits
	halved(t, a, "the share did not move")
	arrive() // the heads Redis chose under a share of 1 arrive

	held[1].Release() // 3 still run (held[2], held[3], w1): nothing more may start
	notStarted(t, a, name, held, w1, w2Ch, w2)
}

// heldHeadsStore is a Store whose Listener hears the first heads named
// once hold is set only when let is closed, as if the goroutine that
// read the reply had been descheduled.
type heldHeadsStore struct {
	fairqueue.Store
	hold atomic.Bool
	let  chan struct{}
}

func (s *heldHeadsStore) Open(ctx context.Context, node string, h fairqueue.Listener) error {
	return s.Store.Open(ctx, node, &heldHeads{Listener: h, s: s})
}

func (s *heldHeadsStore) Transfer(ctx context.Context, t fairqueue.TicketArgs, to string) error {
	return s.Store.(fairqueue.Transferrer).Transfer(ctx, t, to)
}

func (s *heldHeadsStore) Adapt(ctx context.Context, a fairqueue.AdaptArgs) (map[string]float64, error) {
	return s.Store.(fairqueue.Adapter).Adapt(ctx, a)
}

type heldHeads struct {
	fairqueue.Listener
	s *heldHeadsStore
}

func (h *heldHeads) Heads(ids []string, permits int, sent time.Time) {
	if len(ids) > 0 && h.s.hold.CompareAndSwap(true, false) {
		<-h.s.let
	}
	h.Listener.(fairqueue.HeadListener).Heads(ids, permits, sent)
}

// A reply that names the heads may reach the node after a reload that
// gave the queue a learned capacity, though Redis chose them before,
// under all the permits: the share another node learnt stays in Redis,
// and the node, which has not reported yet, knows nothing of it. Its
// local handoff must not start a waiter above the learned permits,
// which Redis' own dispatch keeps to from the reload on.
func TestLocalHandoffKeepsToALearnedCapacityAReloadTurnedOnWhileTheHeadsWereOnTheirWay(t *testing.T) {
	longHeads(t) // the heads, if taken, still serve once the loop's reconcile has landed
	const name = "learnedreload"
	srv := redistest.Start(t)
	learned := learnedCfg(10*time.Second, 3*time.Second)
	plain := learned
	plain.Adaptive = nil
	a, hs := heldHeadsNode(t, srv, name, plain)
	held := holdFour(t, a)
	// b, with the learned capacity, halves the share and leaves: the
	// share stays in Redis.
	b := joinAndLower(t, srv, name, learned)
	require.Equal(t, 0.5, b.q.Share())
	require.NoError(t, b.q.Close())
	w1Ch, _ := queueWaiter(t, a, name)
	w2Ch, w2 := queueWaiter(t, a, name)
	aloneSince(t, a, time.Now())

	w1, arrive := headsOnTheirWay(t, hs, held, w1Ch)
	reloaded := time.Now()
	require.NoError(t, a.q.Reconfigure(learned)) // a reload: 4 x 0.5 = 2 permits from now on
	// A reconcile of a sent before the reload, which grants under all the
	// permits, lands before the release below (the heads stay held).
	beatAfter(t, a, reloaded)
	arrive()

	held[1].Release() // 3 still run (held[2], held[3], w1): nothing more may start
	notStarted(t, a, name, held, w1, w2Ch, w2)
}
