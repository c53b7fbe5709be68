package redisstore_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
	"github.com/fair-queue/caddy-fair-queue/fairqueue/memstore"
	"github.com/fair-queue/caddy-fair-queue/internal/redistest"
)

// A request that comes as Redis goes away waits for its turn into the
// fallback queue behind Redis's waiters moving there. Meanwhile a reload
// sets on_store_error fail_closed, and Redis comes back: let in, the
// request waits in Redis's queue, as one that came then would, and as it
// did where the policy stayed local (the fallback queue retired, it
// waits in the store's). Answered by the policy in force with no check
// that the store was back, it was refused store_unavailable while Redis
// answered.
func TestARequestWaitingItsTurnIntoTheFallbackGoesToRedisBackAfterAReloadToFailClosed(t *testing.T) {
	srv := redistest.Start(t)
	fb := &heldFallback{Store: memstore.New(), entered: make(chan struct{}), lets: make(chan struct{})}
	t.Cleanup(func() {
		select {
		case <-fb.lets:
		default:
			close(fb.lets)
		}
	})
	cfg := fairqueue.Config{Permits: 1, LocalPermits: 3, Fallback: fb,
		Lease: 30 * time.Second, PollInterval: 50 * time.Millisecond, MaxWait: 30 * time.Second}
	n := newNode(t, srv, "fbturnpolicy", cfg)
	holder, err := n.q.Acquire(context.Background(), fairqueue.Request{})
	require.NoError(t, err)

	// w1 waits in Redis behind the holder.
	queued := make(chan struct{})
	w1 := make(chan *fairqueue.Permit, 1)
	go func() {
		p, err := n.q.Acquire(context.Background(), fairqueue.Request{OnQueued: func(fairqueue.Waiting) {
			select {
			case <-queued:
			default:
				close(queued)
			}
		}})
		assert.NoError(t, err)
		w1 <- p
	}()
	<-queued

	// Redis goes away: w1 moves into the fallback queue, held on its way.
	srv.Kill()
	eventually(t, 10*time.Second, func() bool { return !n.q.Stats().StoreUp }, "Redis never marked down")
	<-fb.entered

	// r2 comes now, and waits for its turn behind w1.
	type result struct {
		p   *fairqueue.Permit
		err error
	}
	r2 := make(chan result, 1)
	go func() {
		p, err := n.q.Acquire(context.Background(), fairqueue.Request{})
		r2 <- result{p, err}
	}()
	waitForGoroutineIn(t, "fairqueue.(*Queue).awaitExit")

	// A reload sets fail_closed, and Redis comes back.
	closed := n.q.Config()
	closed.Fallback = nil
	require.NoError(t, n.q.Reconfigure(closed))
	srv.Restart()
	eventually(t, 20*time.Second, func() bool { return n.q.Stats().StoreUp }, "Redis never marked up again")
	close(fb.lets)

	// r2 waits in Redis, behind the holder (and w1): it is served there
	// once they end.
	holder.Release()
	if p := <-w1; p != nil {
		p.Release()
	}
	var r result
	select {
	case r = <-r2:
	case <-time.After(20 * time.Second):
		t.Fatal("r2 was never answered")
	}
	var re *fairqueue.RejectError
	if errors.As(r.err, &re) {
		t.Fatalf("r2 was refused %s while Redis was up: answered by the fail_closed policy as if Redis were still down", re.Reason)
	}
	require.NoError(t, r.err)
	defer r.p.Release()
	assert.False(t, r.p.Local(), "r2 served by the fallback queue")
	assert.False(t, r.p.FailOpen(), "r2 admitted without Redis")
}
