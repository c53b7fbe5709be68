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

// docs/failures.md, "When Redis fails": "a call cut short by its
// request's own end, its client gone or its max_wait over, does not
// [count as a failed call], nor does it count in store_errors_total".
// On a frozen Redis (SIGSTOP), requests whose max_wait (300ms) ends
// before the client's read timeout (500ms) are answered with the timeout
// reject at their max_wait, one after the other, and the store stays up
// with no store error counted. The node's own polls and heartbeats (a
// poll interval of 10 s, a lease of minutes) stay out of the freeze
// (about 3 s): where the setup took so long that the next poll could fall
// in it, the freeze waits until that poll has passed.
func TestCallsCutShortByTheirMaxWaitOnAFrozenRedisAreNoStoreFailure(t *testing.T) {
	t.Parallel() // its own redis-server: it waits on it, not on the CPU
	srv := redistest.Start(t)
	const poll = 10 * time.Second
	const maxWait = 300 * time.Millisecond
	obs := &storeErrors{}
	n := newNode(t, srv, "cutshort", fairqueue.Config{Permits: 1, MaxWait: time.Minute, PollInterval: poll,
		Lease: 10 * time.Minute, Observer: obs})
	joining := time.Now()
	p, err := n.q.Acquire(context.Background(), fairqueue.Request{})
	require.NoError(t, err, "joined while Redis answers")
	joined := time.Now()
	p.Release()
	if k := time.Since(joining)/poll + 1; time.Until(joining.Add(k*poll)) < poll/2 {
		time.Sleep(time.Until(joined.Add(k*poll + 100*time.Millisecond)))
	}
	e0 := obs.n.Load()

	srv.Freeze()
	thawed := false
	t.Cleanup(func() {
		if !thawed {
			srv.Thaw()
		}
	})
	for i := range 3 {
		start := time.Now()
		_, err := n.q.Acquire(context.Background(), fairqueue.Request{MaxWait: maxWait})
		took := time.Since(start)
		var rej *fairqueue.RejectError
		require.True(t, errors.As(err, &rej), "request %d: not a reject: %v", i, err)
		t.Logf("request %d on a frozen Redis: %s after %v", i, rej.Reason, took)
		assert.Equal(t, fairqueue.ReasonTimeout, rej.Reason, "request %d", i)
	}
	// Whatever the requests left to do in the background (their cancels)
	// has had time to fail: twice the client's timeouts.
	time.Sleep(2 * time.Second)
	assert.True(t, n.q.Stats().StoreUp, "calls cut short by their max_wait marked the store down")
	assert.Equal(t, e0, obs.n.Load(), "calls cut short by their max_wait counted as store errors")

	srv.Thaw()
	thawed = true
	ctx, cancel := context.WithTimeout(context.Background(), 3*poll)
	defer cancel()
	p, err = n.q.Acquire(ctx, fairqueue.Request{})
	require.NoError(t, err, "Redis grants again")
	p.Release()
	assert.True(t, n.q.Stats().StoreUp)
}
