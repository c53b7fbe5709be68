package memstore_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
	"github.com/fair-queue/caddy-fair-queue/fairqueue/memstore"
)

// A request whose upstream refused it once its max wait had passed gets
// the timeout reject from its requeue, as on Redis (whose requeue call
// cannot run past the wait's end: redisstore's
// TestAFailedRequeueChargesItsTenantNothing): the local store granted it
// again at once where a permit was free, and the request was sent again
// after its max_wait. Its permit is given back all the same, and the
// upstream that refused it cools: the next request goes to the other.
func TestARequeuePastItsMaxWaitIsATimeoutOnTheLocalStore(t *testing.T) {
	q, err := fairqueue.New(memstore.New(), fairqueue.Config{
		Permits: 2, MaxWait: time.Minute, Lease: 10 * time.Second,
		Upstreams: []fairqueue.Upstream{{Dial: "a:1", Permits: 1}, {Dial: "b:1", Permits: 1}},
	})
	require.NoError(t, err)
	t.Cleanup(func() { _ = q.Close() })
	ctx := context.Background()

	p, err := q.Acquire(ctx, fairqueue.Request{MaxWait: 100 * time.Millisecond})
	require.NoError(t, err)
	refused := p.Upstream()
	time.Sleep(200 * time.Millisecond) // past its max wait: a deadline, not a speed
	again, err := p.Requeue(ctx, time.Minute)
	if again != nil {
		again.Release()
	}
	var rej *fairqueue.RejectError
	require.True(t, errors.As(err, &rej), "a requeue past the max wait is the timeout reject, got a permit on %v (%v)", upstreamOf(again), err)
	assert.Equal(t, fairqueue.ReasonTimeout, rej.Reason)

	// Its permit was given back, and its upstream cools: the next
	// request is granted on the other upstream.
	next, err := q.Acquire(ctx, fairqueue.Request{MaxWait: time.Second})
	require.NoError(t, err, "the refused request's permit is given back")
	defer next.Release()
	assert.NotEqual(t, refused, next.Upstream(), "the upstream that refused the request cools")
}

func upstreamOf(p *fairqueue.Permit) string {
	if p == nil {
		return "nothing"
	}
	return p.Upstream()
}
