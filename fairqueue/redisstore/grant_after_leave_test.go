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

// heldCancel holds a cancel on its way to Redis, once hold is set, until
// go is closed: a slow Redis or network between a waiter's leaving and
// its cancel.
type heldCancel struct {
	fairqueue.Store
	*gate
}

func (s *heldCancel) Cancel(ctx context.Context, t fairqueue.TicketArgs) error {
	s.pass()
	return s.Store.Cancel(ctx, t)
}

// A waiter whose client left is granted before its cancel reaches Redis:
// the node, which forgot the ticket as it left, gives the grant back. The
// request ran nowhere, so its tenant is charged nothing for the grant,
// whichever of the release and the cancel reaches Redis first: tenant l's
// next request, queued behind three of tenant o, is served after o's
// first, not after all three.
func TestAGrantThatMeetsItsWaiterGoneChargesItsTenantNothing(t *testing.T) {
	srv := redistest.Start(t)
	cfg := fairqueue.Config{Permits: 1, Fair: true, MaxWait: time.Minute, Lease: 10 * time.Second}
	s := &heldCancel{gate: newGate()}
	n := wrappedNode(t, srv, "grantgone", cfg, func(st fairqueue.Store) fairqueue.Store { s.Store = st; return s })
	ctx := context.Background()

	first, err := n.q.Acquire(ctx, fairqueue.Request{Tenant: "h"})
	require.NoError(t, err)
	leaving, leave := context.WithCancel(ctx)
	left := make(chan error, 1)
	go func() {
		_, err := n.q.Acquire(leaving, fairqueue.Request{Tenant: "l", Cost: 5})
		left <- err
	}()
	eventually(t, 10*time.Second, func() bool {
		return len(readState(t, n.rdb, "grantgone").Waiting) == 1
	}, "l's request queued")
	s.hold.Store(true)
	leave()
	<-s.entered // l's waiter has left; its cancel is on its way
	first.Release()
	eventually(t, 10*time.Second, func() bool {
		st := readState(t, n.rdb, "grantgone")
		return len(st.Holders) == 0 && len(st.Waiting) == 0
	}, "the grant to l, whose waiter left, is given back")
	close(s.go_)
	require.ErrorIs(t, <-left, context.Canceled)

	assertLevel(t, n, "grantgone", "its waiter never used")
}

// gate holds one store call on its way to Redis, once hold is set, until
// go_ is closed (a slow Redis or network); entered is closed as it holds.
type gate struct {
	hold    atomic.Bool
	entered chan struct{}
	go_     chan struct{}
}

func newGate() *gate { return &gate{entered: make(chan struct{}), go_: make(chan struct{})} }

// pass holds the call, once armed.
func (g *gate) pass() {
	if g.hold.CompareAndSwap(true, false) {
		close(g.entered)
		<-g.go_
	}
}
