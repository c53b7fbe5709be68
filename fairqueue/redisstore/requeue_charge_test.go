package redisstore_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
	"github.com/fair-queue/caddy-fair-queue/internal/redistest"
)

// A request whose upstream refused it and whose requeue fails before it
// reaches the store (its max wait is over: the client gets the timeout
// reject) ran nowhere, as one requeued does: its tenant is charged
// nothing for the grant, as Permit.Requeue promises. Tenant l's request
// of cost 5 is granted, refused past its max wait; l's next request,
// queued behind three of tenant o, is served level with o's: after o's
// first, not after all three.
func TestAFailedRequeueChargesItsTenantNothing(t *testing.T) {
	srv := redistest.Start(t)
	cfg := fairqueue.Config{Permits: 1, Fair: true, MaxWait: time.Minute, Lease: 10 * time.Second}
	n := newNode(t, srv, "requeuecharge", cfg)
	ctx := context.Background()

	p, err := n.q.Acquire(ctx, fairqueue.Request{Tenant: "l", Cost: 5, MaxWait: time.Second})
	require.NoError(t, err)
	time.Sleep(1100 * time.Millisecond) // past its max wait: the requeue cannot wait again
	_, err = p.Requeue(ctx, -1)
	var rej *fairqueue.RejectError
	require.True(t, errors.As(err, &rej), "the requeue past the max wait is a reject: %v", err)
	assert.Equal(t, fairqueue.ReasonTimeout, rej.Reason)
	eventually(t, 10*time.Second, func() bool {
		return len(readState(t, n.rdb, "requeuecharge").Holders) == 0
	}, "the refused request's permit is given back")

	assertLevel(t, n, "requeuecharge", "its upstream refused")
}

// assertLevel queues, behind a holder of tenant h, three requests of
// tenant o, then one of tenant l, on n's queue name (1 permit, fair), and
// asserts l is served level with o, which came first: after o's first,
// not after all three. l's last grant, one that ran nowhere, was charged
// nothing (why says how it ran nowhere).
func assertLevel(t *testing.T, n *node, name, why string) {
	t.Helper()
	ctx := context.Background()
	holder, err := n.q.Acquire(ctx, fairqueue.Request{Tenant: "h"})
	require.NoError(t, err)
	granted := make(chan string, 4)
	permits := make(chan *fairqueue.Permit, 4)
	queue := func(tenant string, waiting int) {
		go func() {
			p, err := n.q.Acquire(ctx, fairqueue.Request{Tenant: tenant})
			if err != nil {
				granted <- "error: " + err.Error()
				return
			}
			granted <- tenant
			permits <- p
		}()
		eventually(t, 10*time.Second, func() bool {
			return len(readState(t, n.rdb, name).Waiting) == waiting
		}, "%s's request queued", tenant)
	}
	for i := range 3 {
		queue("o", i+1)
	}
	queue("l", 4)
	holder.Release()
	var order []string
	for range 4 {
		order = append(order, <-granted)
		(<-permits).Release()
	}
	assert.Equal(t, []string{"o", "l", "o", "o"}, order, "l is charged nothing for the grant %s", why)
}

// The upstream that refused a request cools, as Permit.Requeue promises,
// also where the requeue fails before it reaches the store (the
// request's max wait is over): its next grants go to the other upstream
// of the pool while it cools.
func TestAFailedRequeueCoolsTheUpstreamThatRefused(t *testing.T) {
	srv := redistest.Start(t)
	cfg := fairqueue.Config{Permits: 2, MaxWait: time.Minute, Lease: 10 * time.Second,
		Upstreams: []fairqueue.Upstream{{Dial: "a:1", Permits: 1}, {Dial: "b:1", Permits: 1}}}
	n := newNode(t, srv, "requeuecool", cfg)
	ctx := context.Background()

	p, err := n.q.Acquire(ctx, fairqueue.Request{MaxWait: time.Second})
	require.NoError(t, err)
	refused := p.Upstream()
	require.NotEmpty(t, refused)
	time.Sleep(1100 * time.Millisecond) // past its max wait: the requeue cannot wait again
	_, err = p.Requeue(ctx, 30*time.Second)
	var rej *fairqueue.RejectError
	require.True(t, errors.As(err, &rej), "the requeue past the max wait is a reject: %v", err)
	eventually(t, 10*time.Second, func() bool {
		return len(readState(t, n.rdb, "requeuecool").Holders) == 0
	}, "the refused request's permit is given back")

	for range 2 {
		p, err := n.q.Acquire(ctx, fairqueue.Request{MaxWait: 2 * time.Second})
		if err != nil {
			continue // the only upstream in dispatch is busy
		}
		assert.NotEqual(t, refused, p.Upstream(), "granted on the upstream that refused, which should cool")
		defer p.Release()
	}
	snap, err := n.q.Inspect(ctx, 10, 10)
	require.NoError(t, err)
	for _, u := range snap.Upstreams {
		if u.Dial == refused {
			assert.Positive(t, u.CoolLeft, "the upstream that refused cools")
		}
	}
}
