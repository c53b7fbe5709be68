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

// A second Queue on a Store that a first Queue has open is refused
// (TestStoreOpenedByASecondQueueIsRefused); its caller closes it, as one
// does with what failed. That Close must leave the first Queue's
// subscription to it: the first Queue's waiter is still served by the
// grant another instance's release publishes, and a later second Queue
// is still refused.
func TestClosingARefusedQueueLeavesTheStoreToTheFirst(t *testing.T) {
	srv := redistest.Start(t)
	rdb := srv.Client(t)
	ctx := context.Background()
	cfg := fairqueue.Config{Permits: 1, MaxWait: 3 * time.Second, PollInterval: 3 * time.Second, Lease: time.Minute}
	st := redisstore.New(rdb, "refused", redisstore.Options{})
	a, err := fairqueue.New(st, cfg)
	require.NoError(t, err)
	t.Cleanup(func() { _ = a.Close() })
	p, err := a.Acquire(ctx, fairqueue.Request{}) // a opens the store
	require.NoError(t, err)
	p.Release()

	b, err := fairqueue.New(st, cfg)
	require.NoError(t, err)
	_, errB := b.Acquire(ctx, fairqueue.Request{})
	require.Error(t, errB, "a second Queue on the Store a first one has open")
	_ = b.Close()
	assert.Equal(t, 1, subscribers(t, srv), "a's subscription to its grant channel, once b is closed")

	// Another instance of the queue, with a Store of its own.
	c, err := fairqueue.New(redisstore.New(rdb, "refused", redisstore.Options{}), cfg)
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })
	held, err := c.Acquire(ctx, fairqueue.Request{})
	require.NoError(t, err)
	got := make(chan error, 1)
	go func() {
		p, err := a.Acquire(ctx, fairqueue.Request{})
		if p != nil {
			p.Release()
		}
		got <- err
	}()
	eventually(t, 2*time.Second, func() bool { return a.Stats().Waiting == 1 }, "a's request never queued")
	held.Release() // grants a's waiter in Redis, and publishes it on a's channel
	select {
	case err := <-got:
		assert.NoError(t, err, "a's waiter, granted by c's release")
	case <-time.After(10 * time.Second):
		t.Fatal("a's waiter was not answered")
	}

	d, err := fairqueue.New(st, cfg)
	require.NoError(t, err)
	t.Cleanup(func() { _ = d.Close() })
	pd, errD := d.Acquire(ctx, fairqueue.Request{MaxWait: time.Second})
	if pd != nil {
		pd.Release()
	}
	assert.Error(t, errD, "a later second Queue on the Store a is still using")
}

// subscribers counts the channels with a subscriber, sharded or not.
func subscribers(t *testing.T, srv *redistest.Server) int {
	t.Helper()
	rdb := srv.Client(t)
	plain, err := rdb.PubSubChannels(context.Background(), "*").Result()
	require.NoError(t, err)
	sharded, err := rdb.PubSubShardChannels(context.Background(), "*").Result()
	require.NoError(t, err)
	return len(plain) + len(sharded)
}
