package redisstore_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
	"github.com/fair-queue/caddy-fair-queue/fairqueue/redisstore"
	"github.com/fair-queue/caddy-fair-queue/internal/redistest"
)

// The node's background loop reads the settings, heartbeats, and then,
// while it has waiters, reconciles: a dispatch of the permits free in
// the store; the heartbeat itself queues again the waiters the store
// lost, a dispatch too. A reload that lands while the heartbeat is on
// its way must not leave them to dispatch under the settings before it: a
// waiter would start above the permits the reload allows (a lowered
// setting, or a learned capacity turned on whose share is in Redis),
// where every other call of the node keeps to them from the reload on.
func TestDispatchAfterAHeartbeatKeepsToAReloadsPermits(t *testing.T) {
	plain := learnedCfg(10*time.Second, 3*time.Second) // a tick, a heartbeat and a reconcile every second
	plain.Adaptive = nil
	lowered := plain
	lowered.Permits = 2
	for i, c := range []struct {
		name   string
		reload fairqueue.Config
		// lower, if set, lowers the learned share in Redis first; lose
		// takes the waiter out of Redis while the heartbeat, which names
		// it, is on its way: the node queues it again.
		lower, lose bool
	}{
		{name: "a lowered permits setting", reload: lowered},
		{name: "a learned capacity turned on", reload: learnedCfg(10*time.Second, 3*time.Second), lower: true},
		{name: "a waiter the store lost queued again", reload: lowered, lose: true},
	} {
		t.Run(c.name, func(t *testing.T) {
			name := fmt.Sprintf("reconcilereload%d", i)
			srv := redistest.Start(t)
			hs := &heldBeatStore{entered: make(chan struct{}), let: make(chan struct{}), reconciled: make(chan struct{})}
			a := wrappedNode(t, srv, name, plain, func(s fairqueue.Store) fairqueue.Store { hs.Store = s; return hs })
			held := holdFour(t, a)
			if c.lower {
				// b, with the learned capacity, halves the share and
				// leaves: the share stays in Redis.
				b := joinAndLower(t, srv, name, c.reload)
				require.Equal(t, 0.5, b.q.Share())
				require.NoError(t, b.q.Close())
			}
			wCh, w := queueWaiter(t, a, name)

			hs.hold.Store(true) // the next heartbeat waits: the loop has read the settings
			select {
			case <-hs.entered:
			case <-time.After(30 * time.Second):
				t.Fatal("no heartbeat of a came")
			}
			require.NoError(t, a.q.Reconfigure(c.reload)) // 2 permits from now on
			held[0].Release()                             // 3 still run: nothing may start
			require.Len(t, readState(t, a.rdb, name).Holders, 3)
			if c.lose {
				tag := redisstore.New(a.rdb, name, redisstore.Options{}).Tag()
				require.NoError(t, a.rdb.ZRem(context.Background(), tag+":waiting", w).Err())
			}
			hs.watch.Store(true)
			close(hs.let) // the heartbeat returns, and the loop reconciles
			select {
			case <-hs.reconciled:
			case <-time.After(30 * time.Second):
				t.Fatal("a did not reconcile after its heartbeat")
			}

			st := readState(t, a.rdb, name)
			assert.NotContains(t, st.Holders, w, "w started with 3 running under 2 permits")
			assert.Len(t, st.Holders, 3)
			for _, p := range held[1:] {
				p.Release()
			}
			got := <-wCh
			require.NoError(t, got.err)
			got.p.Release()
		})
	}
}

// heldBeatStore is a Store whose Heartbeat, once hold is set, waits
// until let is closed (entered is closed as it begins to wait), as if
// the call had been slow; the first Reconcile that returns once watch is
// set closes reconciled. It takes learned capacities (Adapter).
type heldBeatStore struct {
	fairqueue.Store
	hold, watch atomic.Bool
	entered     chan struct{}
	let         chan struct{}
	reconciled  chan struct{}
}

func (s *heldBeatStore) Heartbeat(ctx context.Context, hb fairqueue.HeartbeatArgs) (fairqueue.HeartbeatResult, error) {
	if s.hold.CompareAndSwap(true, false) {
		close(s.entered)
		<-s.let
	}
	return s.Store.Heartbeat(ctx, hb)
}

func (s *heldBeatStore) Reconcile(ctx context.Context, node string, l fairqueue.Limits) (fairqueue.ReconcileResult, error) {
	res, err := s.Store.Reconcile(ctx, node, l)
	if s.watch.CompareAndSwap(true, false) {
		close(s.reconciled)
	}
	return res, err
}

func (s *heldBeatStore) Adapt(ctx context.Context, a fairqueue.AdaptArgs) (map[string]float64, error) {
	return s.Store.(fairqueue.Adapter).Adapt(ctx, a)
}
