package memstore_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
	"github.com/fair-queue/caddy-fair-queue/fairqueue/memstore"
)

// A node's report whose reply is slow (a store that takes longer than
// an interval to answer) must not be read after the reply of a later
// report: the node would hear of the share as it was before the later
// report moved it, and keep to that (its local handoffs, its fallback
// queue, its metric) until its next reply. Here the first report's
// reply, a share of 1, is held while a breach halves the share: the
// node must end up knowing the share in the store, 0.5.
func TestALateReplyOfAnOlderReportDoesNotUndoANewerShare(t *testing.T) {
	s := &lateReplyStore{Store: memstore.New(), held: make(chan struct{}), let: make(chan struct{})}
	q, err := fairqueue.New(s, fairqueue.Config{Name: "lateshare", Permits: 4, MaxWait: time.Minute,
		Adaptive: &fairqueue.Adaptive{TargetTTFT: 100 * time.Millisecond, Interval: 100 * time.Millisecond,
			Decrease: 0.5, MinSamples: 1}})
	require.NoError(t, err)
	t.Cleanup(func() { _ = q.Close() })
	p, err := q.Acquire(context.Background(), fairqueue.Request{}) // joins the queue
	require.NoError(t, err)
	p.Release()

	q.ObserveTTFT("", time.Millisecond) // under the target: the first report, its reply held
	<-s.held
	time.Sleep(200 * time.Millisecond) // an interval passes
	q.ObserveTTFT("", time.Second)     // a breach: the share halves in the store
	// A second report, if one goes now, is answered before the first.
	deadline := time.Now().Add(3 * time.Second)
	for s.returned.Load() < 1 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	close(s.let)
	require.Eventually(t, func() bool { return s.returned.Load() >= 2 }, 10*time.Second, 10*time.Millisecond,
		"the breach was never reported")
	snap, err := s.Inspect(context.Background(), 0, 0)
	require.NoError(t, err)
	require.Equal(t, 0.5, snap.LearnedShare, "the store's share")
	require.NoError(t, q.Close()) // every reply read
	require.Equal(t, map[string]float64{"": 0.5}, q.Shares(), "the node keeps the share of an older report's reply, read last")
}

// lateReplyStore holds the reply of its first Adapt call until let is
// closed; returned counts the calls that returned.
type lateReplyStore struct {
	*memstore.Store
	calls     atomic.Int32
	returned  atomic.Int32
	held, let chan struct{}
}

func (s *lateReplyStore) Adapt(ctx context.Context, a fairqueue.AdaptArgs) (map[string]float64, error) {
	shares, err := s.Store.Adapt(ctx, a)
	if s.calls.Add(1) == 1 {
		close(s.held)
		<-s.let
	}
	s.returned.Add(1)
	return shares, err
}
