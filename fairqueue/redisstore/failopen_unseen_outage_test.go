package redisstore_test

import (
	"context"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
	"github.com/fair-queue/caddy-fair-queue/internal/redistest"
)

// answerHeldBeatStore is a Store that, once armed, holds the answer of the
// next heartbeat Redis answered (held is closed then) until release is
// closed: an answer on its way back while the node's other calls fail.
type answerHeldBeatStore struct {
	fairqueue.Store
	arm     atomic.Bool
	once    sync.Once
	held    chan struct{}
	release chan struct{}
}

func (s *answerHeldBeatStore) Heartbeat(ctx context.Context, a fairqueue.HeartbeatArgs) (fairqueue.HeartbeatResult, error) {
	res, err := s.Store.Heartbeat(ctx, a)
	if err == nil && !res.Rejoined && s.arm.Load() {
		s.once.Do(func() {
			close(s.held)
			<-s.release
		})
	}
	return res, err
}

// docs/failures.md, "When Redis fails": fail_open's requests "are
// registered as holders by the next heartbeat once Redis is back". The
// store can be marked up again by a call on its way since before it was
// marked down: here the node's own heartbeat, sent before Redis froze
// and answered after (answerHeldBeatStore), while a request's calls timed out
// on the frozen Redis, marked the store down, and the request was
// admitted fail_open. The node's loop never read the store down (it was
// in that heartbeat), so it did not heartbeat once the store was back:
// Redis counted the fail-open request only at the next regular heartbeat
// (a third of the lease), and granted another instance's request beside
// it, above permits 1, meanwhile.
func TestAFailOpenPermitOfAnOutageTheLoopNeverSawIsCountedOnceRedisIsBack(t *testing.T) {
	t.Parallel() // its own redis-server: it waits on it, not on the CPU
	srv := redistest.Start(t)
	const name = "failopenunseen"
	// A long lease: the next regular heartbeat is a minute away.
	cfg := fairqueue.Config{Permits: 1, FailOpen: true, Lease: 3 * time.Minute,
		PollInterval: 50 * time.Millisecond, MaxWait: 20 * time.Second}
	hb := &answerHeldBeatStore{held: make(chan struct{}), release: make(chan struct{})}
	a := wrappedNode(t, srv, name, cfg, func(s fairqueue.Store) fairqueue.Store { hb.Store = s; return hb })
	b := newNode(t, srv, name, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for _, n := range []*node{a, b} {
		p, err := n.q.Acquire(ctx, fairqueue.Request{})
		require.NoError(t, err)
		p.Release()
	}
	eventually(t, 10*time.Second, func() bool { return len(readState(t, b.rdb, name).Holders) == 0 },
		"the warm-up permits are released")

	// The node's next heartbeat (at once: a resync) is answered, and its
	// answer held on its way.
	hb.arm.Store(true)
	a.q.Resynced()
	select {
	case <-hb.held:
	case <-ctx.Done():
		t.Fatal("no heartbeat held")
	}
	released := false
	defer func() {
		if !released {
			close(hb.release)
		}
	}()

	srv.Freeze()
	thawed := false
	defer func() {
		if !thawed {
			srv.Thaw()
		}
	}()
	p1, err := a.q.Acquire(ctx, fairqueue.Request{})
	require.NoError(t, err)
	defer p1.Release()
	require.True(t, p1.FailOpen(), "admitted fail_open: its calls timed out on the frozen Redis")
	require.False(t, a.q.Stats().StoreUp, "the store is marked down")

	srv.Thaw()
	thawed = true
	close(hb.release) // the heartbeat's answer comes in: the store reads up
	released = true
	require.Eventually(t, func() bool { return a.q.Stats().StoreUp }, 10*time.Second, 10*time.Millisecond,
		"the heartbeat's answer marks the store up")

	// Counted well within the docs' second or so (a regular heartbeat
	// would come only a minute later).
	var holders []string
	ok := assertEventually(10*time.Second, func() bool {
		holders = readState(t, b.rdb, name).Holders
		return slices.Contains(holders, p1.Ticket())
	})
	require.True(t, ok, "Redis counts the fail_open permit once it is back: holders %v, not %s", holders, p1.Ticket())

	// And another instance's request waits for it (permits 1), once the
	// ticket of the request's timed-out calls, which Redis may have run
	// late, is given back.
	eventually(t, 10*time.Second, func() bool {
		return slices.Equal(readState(t, b.rdb, name).Holders, []string{p1.Ticket()})
	}, "Redis holds the fail_open permit alone")
	bctx, bcancel := context.WithTimeout(ctx, time.Second)
	defer bcancel()
	p2, err := b.q.Acquire(bctx, fairqueue.Request{})
	if err == nil {
		p2.Release()
	}
	require.Error(t, err, "another instance's request was granted beside the fail_open one, above permits 1")
}

// A requeue whose one call timed out on a frozen Redis is admitted by
// fail_open while the store still reads up (one failure does not mark it
// down, and no dial failed): nothing marks the store down or up, and a
// node without waiters has no reason to heartbeat before a third of its
// lease. Redis must count that fail_open permit once it answers again,
// as it counts one admitted during an outage the node saw.
func TestAFailOpenRequeueOfOneFailedCallIsCountedOnceRedisAnswers(t *testing.T) {
	t.Parallel() // its own redis-server: it waits on it, not on the CPU
	srv := redistest.Start(t)
	const name = "failopenrequeue"
	cfg := fairqueue.Config{Permits: 1, FailOpen: true, Lease: 3 * time.Minute,
		PollInterval: 50 * time.Millisecond, MaxWait: 20 * time.Second}
	a := newNode(t, srv, name, cfg)
	b := newNode(t, srv, name, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pb, err := b.q.Acquire(ctx, fairqueue.Request{})
	require.NoError(t, err)
	pb.Release()
	p, err := a.q.Acquire(ctx, fairqueue.Request{})
	require.NoError(t, err)
	eventually(t, 10*time.Second, func() bool {
		return slices.Equal(readState(t, b.rdb, name).Holders, []string{p.Ticket()})
	}, "Redis holds the request's permit alone")
	// Its first heartbeat (the join's, which finds it rejoined, and the
	// one after) done: none is due for a minute.
	time.Sleep(500 * time.Millisecond)

	srv.Freeze()
	thawed := false
	defer func() {
		if !thawed {
			srv.Thaw()
		}
	}()
	p1, err := p.Requeue(ctx, -1)
	srv.Thaw()
	thawed = true
	require.NoError(t, err)
	defer p1.Release()
	require.True(t, p1.FailOpen(), "admitted fail_open: its requeue timed out on the frozen Redis")

	var holders []string
	ok := assertEventually(10*time.Second, func() bool {
		holders = readState(t, b.rdb, name).Holders
		return slices.Equal(holders, []string{p1.Ticket()})
	})
	require.True(t, ok, "Redis counts the fail_open permit alone once it answers again: holders %v, not %s (store up: %v)",
		holders, p1.Ticket(), a.q.Stats().StoreUp)
	bctx, bcancel := context.WithTimeout(ctx, time.Second)
	defer bcancel()
	p2, err := b.q.Acquire(bctx, fairqueue.Request{})
	if err == nil {
		p2.Release()
	}
	require.Error(t, err, "another instance's request was granted beside the fail_open one, above permits 1")
}

// assertEventually polls cond every 10ms until it holds (true) or d
// passes (false).
func assertEventually(d time.Duration, cond func() bool) bool {
	for end := time.Now().Add(d); ; time.Sleep(10 * time.Millisecond) {
		if cond() {
			return true
		}
		if time.Now().After(end) {
			return false
		}
	}
}
