package redisstore_test

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
	"github.com/fair-queue/caddy-fair-queue/internal/redistest"
)

// heldRelease holds a release on its way to Redis, once hold is set,
// until go_ is closed.
type heldRelease struct {
	fairqueue.Store
	*gate
}

func (s *heldRelease) Release(ctx context.Context, t fairqueue.TicketArgs) error {
	s.pass()
	return s.Store.Release(ctx, t)
}

// A request charged what it really used (here nothing: its client left
// as it was granted, Permit.Charge(0)) is released; while its release
// is on its way, a reconcile (the node has a waiter) finds the grant
// among the node's holders, unknown to the node, and releases it first.
// The charge stands all the same, whichever of the two reaches Redis
// first: tenant l's next request, queued behind three of tenant o, is
// served after o's first, not after all three.
func TestAChargedReleaseMetByAGhostReleaseKeepsItsCharge(t *testing.T) {
	srv := redistest.Start(t)
	cfg := fairqueue.Config{Permits: 1, Fair: true, MaxWait: time.Minute, Lease: 10 * time.Second,
		PollInterval: fairqueue.MinPollInterval}
	s := &heldRelease{gate: newGate()}
	n := wrappedNode(t, srv, "releaseghost", cfg, func(st fairqueue.Store) fairqueue.Store { s.Store = st; return s })
	ctx := context.Background()

	p, err := n.q.Acquire(ctx, fairqueue.Request{Tenant: "l", Cost: 5})
	require.NoError(t, err)
	time.Sleep(300 * time.Millisecond) // past the window of a grant message in flight
	next := make(chan *fairqueue.Permit, 1)
	go func() {
		p, err := n.q.Acquire(ctx, fairqueue.Request{Tenant: "o"})
		if err == nil {
			next <- p
		}
		close(next)
	}()
	eventually(t, 10*time.Second, func() bool {
		return len(readState(t, n.rdb, "releaseghost").Waiting) == 1
	}, "o's request waits: the node reconciles")
	s.hold.Store(true)
	p.Charge(0)
	released := make(chan struct{})
	go func() {
		p.Release()
		close(released)
	}()
	<-s.entered
	var once sync.Once
	land := func() { once.Do(func() { close(s.go_) }) }
	t.Cleanup(land)
	eventually(t, 10*time.Second, func() bool {
		return !slices.Contains(readState(t, n.rdb, "releaseghost").Holders, p.Ticket())
	}, "a reconcile releases the holder the node forgot while its release is on its way")
	land()
	<-released
	o, ok := <-next
	require.True(t, ok, "o's request is served")
	o.Release()
	eventually(t, 10*time.Second, func() bool {
		st := readState(t, n.rdb, "releaseghost")
		return len(st.Holders) == 0 && len(st.Waiting) == 0
	}, "every permit given back")

	assertLevel(t, n, "releaseghost", "its client left (its release landed after a reconcile released it)")
}
