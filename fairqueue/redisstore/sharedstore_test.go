package redisstore_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
	"github.com/fair-queue/caddy-fair-queue/fairqueue/redisstore"
	"github.com/fair-queue/caddy-fair-queue/internal/redistest"
)

// One redisstore.Store holds one node's subscription and listener: a
// second Queue opening it is refused with an error that says so, and the
// first Queue goes on as before. Without that refusal the second Queue's
// listener received the grants the first Queue's releases made to its
// own waiters, did not know them and gave the permits away: the waiter
// waited out its max wait beside a free permit.
func TestStoreOpenedByASecondQueueIsRefused(t *testing.T) {
	srv := redistest.Start(t)
	st := redisstore.New(srv.Client(t), "shared", redisstore.Options{})
	cfg := fairqueue.Config{Permits: 1, MaxWait: 3 * time.Second}
	a, err := fairqueue.New(st, cfg)
	require.NoError(t, err)
	t.Cleanup(func() { _ = a.Close() })
	b, err := fairqueue.New(st, cfg)
	require.NoError(t, err)
	t.Cleanup(func() { _ = b.Close() })
	ctx := context.Background()

	p, err := a.Acquire(ctx, fairqueue.Request{}) // a opens the store
	require.NoError(t, err)
	p.Release()
	pb, errB := b.Acquire(ctx, fairqueue.Request{}) // b opens it too
	if pb != nil {
		pb.Release()
	}

	held, err := a.Acquire(ctx, fairqueue.Request{})
	require.NoError(t, err)
	type result struct {
		p   *fairqueue.Permit
		err error
	}
	got := make(chan result, 1)
	go func() {
		p, err := a.Acquire(ctx, fairqueue.Request{})
		got <- result{p, err}
	}()
	eventually(t, 2*time.Second, func() bool { return a.Stats().Waiting == 1 }, "a's second request never queued")
	time.Sleep(300 * time.Millisecond) // a reconcile or two of a's waiter
	held.Charge(2)                     // a release through the store's script, not a local handoff
	held.Release()
	r := <-got
	if assert.NoError(t, r.err, "a's waiter, served by a's release") {
		time.Sleep(300 * time.Millisecond) // a stray release of its permit would have run
		assert.Equal(t, []string{r.p.Ticket()}, readState(t, srv.Client(t), "shared").Holders,
			"the waiter's permit, held in Redis while it runs")
		_, err := a.Acquire(ctx, fairqueue.Request{MaxWait: 200 * time.Millisecond})
		assert.ErrorIs(t, err, fairqueue.ErrTimeout, "the only permit is held")
		r.p.Release()
	}

	require.Error(t, errB, "a second Queue on the Store a first one has open")
	assert.ErrorIs(t, errB, fairqueue.ErrStoreUnavailable)
	assert.Contains(t, errB.Error(), "one Store per Queue")
}
