package storetest

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
)

func init() {
	cases = append(cases,
		testCase{"GrantThatMeetsItsWaiterGoneChargesNothing", grantMeetsWaiterGone},
	)
}

// heldCancel holds the next cancel, once hold is set, until release is
// closed: a slow store between a waiter's leaving and its cancel.
type heldCancel struct {
	fairqueue.Store
	hold             atomic.Bool
	entered, release chan struct{}
}

func (s *heldCancel) Cancel(ctx context.Context, t fairqueue.TicketArgs) error {
	if s.hold.CompareAndSwap(true, false) {
		close(s.entered)
		<-s.release
	}
	return s.Store.Cancel(ctx, t)
}

// A waiter whose client left is granted before its cancel reaches the
// store: the node, which forgot the ticket as the client left, gives
// the grant back. The request ran nowhere, so its tenant is charged
// nothing: tenant l's next request, queued behind three of tenant o, is
// served after o's first, not after all three.
func grantMeetsWaiterGone(t *testing.T, h Harness) {
	const name = "grantleft"
	if h.Store == nil {
		t.Skip("the harness drives no Store directly")
	}
	s := &heldCancel{Store: h.Store(t, name), entered: make(chan struct{}), release: make(chan struct{})}
	q, err := fairqueue.New(s, fairqueue.Config{Name: name, Permits: 1, Fair: true, MaxWait: time.Minute,
		Lease: 10 * time.Second})
	require.NoError(t, err)
	t.Cleanup(func() { _ = q.Close() })
	waiting := func(n int, what string) {
		eventually(t, 10*time.Second, func() bool { w, _ := h.State(t, name); return len(w) == n }, "%s", what)
	}

	first, err := q.Acquire(bg, fairqueue.Request{Tenant: "h"})
	require.NoError(t, err)
	leaving, leave := context.WithCancel(bg)
	left := make(chan error, 1)
	go func() {
		_, err := q.Acquire(leaving, fairqueue.Request{Tenant: "l", Cost: 5})
		left <- err
	}()
	waiting(1, "l's request queued")
	s.hold.Store(true)
	leave()
	<-s.entered // l's waiter has left; its cancel is on its way
	first.Release()
	eventually(t, 10*time.Second, func() bool {
		w, held := h.State(t, name)
		return len(w) == 0 && len(held) == 0
	}, "the grant to l, whose waiter left, is given back")
	close(s.release)
	require.ErrorIs(t, <-left, context.Canceled)

	holder, err := q.Acquire(bg, fairqueue.Request{Tenant: "h"})
	require.NoError(t, err)
	granted := make(chan string, 4)
	permits := make(chan *fairqueue.Permit, 4)
	for i, tenant := range []string{"o", "o", "o", "l"} {
		go func() {
			p, err := q.Acquire(bg, fairqueue.Request{Tenant: tenant})
			if err != nil {
				granted <- "error: " + err.Error()
				return
			}
			granted <- tenant
			permits <- p
		}()
		waiting(i+1, tenant+"'s request queued")
	}
	holder.Release()
	var order []string
	for range 4 {
		order = append(order, <-granted)
		(<-permits).Release()
	}
	assert.Equal(t, []string{"o", "l", "o", "o"}, order, "l is charged for the grant its waiter never used")
}
