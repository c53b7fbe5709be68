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
			return len(readState(t, n.rdb, "requeuecharge").Waiting) == waiting
		}, "%s's request queued", tenant)
	}
	for i := range 3 {
		queue("o", i+1)
	}
	queue("l", 4)
	holder.Release()
	var order []string
	for range 2 {
		order = append(order, <-granted)
		(<-permits).Release()
	}
	assert.Equal(t, []string{"o", "l"}, order, "l is charged nothing for the grant its upstream refused")
	for range 2 {
		<-granted
		(<-permits).Release()
	}
}
