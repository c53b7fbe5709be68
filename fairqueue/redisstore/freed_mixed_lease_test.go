package redisstore_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
	"github.com/fair-queue/caddy-fair-queue/fairqueue/redisstore"
	"github.com/fair-queue/caddy-fair-queue/internal/redistest"
)

// errLateBeat is the error a lateBeat's failed heartbeat returns.
var errLateBeat = errors.New("heartbeat: i/o timeout")

// lateBeat wraps a node's store: once arm is set, the next heartbeat
// fails for the node (a read timeout) and its call is handed to late
// instead, for the test to run in Redis later, as a frozen Redis or a
// late retry of the client runs it (or never, if late is nil).
type lateBeat struct {
	fairqueue.Store
	arm  atomic.Bool
	late chan fairqueue.HeartbeatArgs
}

func (s *lateBeat) Heartbeat(ctx context.Context, hb fairqueue.HeartbeatArgs) (fairqueue.HeartbeatResult, error) {
	if s.arm.CompareAndSwap(true, false) {
		if s.late != nil {
			s.late <- hb
		}
		return fairqueue.HeartbeatResult{}, errLateBeat
	}
	return s.Store.Heartbeat(ctx, hb)
}

// Instances of one queue with different leases: a's heartbeat naming
// its running request fails for a but runs in Redis later (a frozen
// Redis, a late retry), within a's lease; a's request ends meanwhile, its
// release marked for a's lease so that the late heartbeat does not count
// it again. An instance with a shorter lease releases a marked permit of
// its own meanwhile: the mark of a's release must still hold for a's
// lease, or the late heartbeat counts a's ended request again and its
// permit is held for nobody until a's lease ends (no request of the
// queue is granted meanwhile, although none runs).
func TestAFreedMarkLastsTheReleasingInstancesLeaseWhateverOthersMark(t *testing.T) {
	t.Parallel() // its own redis-server: it waits on it, not on the CPU
	srv := redistest.Start(t)
	cfgA := fairqueue.Config{Permits: 2, Lease: 9 * time.Second, PollInterval: 50 * time.Millisecond, MaxWait: 30 * time.Second}
	cfgB := cfgA
	cfgB.Lease = time.Second
	sa := &lateBeat{late: make(chan fairqueue.HeartbeatArgs, 1)}
	a := wrappedNode(t, srv, "marks", cfgA, func(s fairqueue.Store) fairqueue.Store { sa.Store = s; return sa })
	sb := &lateBeat{}
	b := newNode(t, srv, "marks", cfgB)
	b2 := wrappedNode(t, srv, "marks", cfgB, func(s fairqueue.Store) fairqueue.Store { sb.Store = s; return sb })
	ctx := context.Background()
	tag := redisstore.New(b.rdb, "marks", redisstore.Options{}).Tag()

	pa, err := a.q.Acquire(ctx, fairqueue.Request{})
	require.NoError(t, err)
	sa.arm.Store(true)
	hb := <-sa.late // a's heartbeat naming pa failed for a; Redis runs it later
	require.Contains(t, hb.Held, pa.Ticket())
	failedAt := time.Now()
	pa.Release() // marked for a's lease: the heartbeat may still run

	// b2's heartbeat fails too (for good): b2 marks its releases for its
	// own, shorter lease.
	pb, err := b2.q.Acquire(ctx, fairqueue.Request{})
	require.NoError(t, err)
	sb.arm.Store(true)
	eventually(t, 5*time.Second, func() bool { return !sb.arm.Load() }, "b2's heartbeat never failed")
	pb.Release()
	require.Empty(t, readState(t, b.rdb, "marks").Holders)

	// a's heartbeat runs late: past b2's lease, within a's, after a's
	// reconciles that look for a ghost (a third of a's lease) ended.
	time.Sleep(cfgB.Lease + 100*time.Millisecond)
	if d := cfgA.Lease/3 + 500*time.Millisecond - time.Since(failedAt); d > 0 {
		time.Sleep(d)
	}
	require.Less(t, time.Since(failedAt), cfgA.Lease/2, "too slow to run the late heartbeat within a's lease")
	hctx, cancel := context.WithTimeout(ctx, time.Second)
	_, err = sa.Store.Heartbeat(hctx, hb)
	cancel()
	require.NoError(t, err)

	holders, err := b.rdb.ZRange(ctx, tag+":holders", 0, -1).Result()
	require.NoError(t, err)
	require.Empty(t, holders, "a's ended request is counted again: its permit is held for nobody")
	// Both permits are free: two requests run at once.
	gctx, cancel := context.WithTimeout(ctx, cfgA.Lease/3)
	defer cancel()
	p1, err := b.q.Acquire(gctx, fairqueue.Request{})
	require.NoError(t, err)
	p2, err := b.q.Acquire(gctx, fairqueue.Request{})
	require.NoError(t, err, "a permit is held for nobody")
	p1.Release()
	p2.Release()

	require.NoError(t, a.q.Close())
	require.NoError(t, b.q.Close())
	require.NoError(t, b2.q.Close())
	require.Empty(t, srv.Keys(t, "*"), "keys left after every node left")
}
