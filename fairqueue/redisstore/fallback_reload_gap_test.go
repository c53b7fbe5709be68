package redisstore_test

import (
	"context"
	"errors"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
	"github.com/fair-queue/caddy-fair-queue/fairqueue/memstore"
	"github.com/fair-queue/caddy-fair-queue/internal/redistest"
)

// gapBeatStore is a Store that, once armed, holds the next heartbeat
// sent while the node reads Redis up (up) before it is sent (held is
// closed then) until release is closed: the gap between Redis answering
// again and the heartbeat that has it count the node's local permits,
// drawn out. A heartbeat sent while the node still reads Redis down (the
// one a new subscription asks for at once, Resynced, as Redis comes
// back) goes on: held, nothing else called Redis (the policy answers
// every request, and the loop's probe waits behind it), and the node
// read Redis down for good.
type gapBeatStore struct {
	fairqueue.Store
	arm     atomic.Bool
	up      func() bool // the node reads Redis up; set before arm
	once    sync.Once
	held    chan struct{}
	release chan struct{}
}

func (s *gapBeatStore) Heartbeat(ctx context.Context, a fairqueue.HeartbeatArgs) (fairqueue.HeartbeatResult, error) {
	if s.arm.Load() && s.up() {
		s.once.Do(func() {
			close(s.held)
			<-s.release
		})
	}
	return s.Store.Heartbeat(ctx, a)
}

// intoTheGap arms hb, restarts srv and waits until n reads Redis up and
// its first heartbeat since is held: the gap before the heartbeat that
// has Redis count the fallback queue's permits.
func (s *gapBeatStore) intoTheGap(t *testing.T, n *node, srv *redistest.Server) {
	t.Helper()
	s.arm.Store(true)
	srv.Restart()
	eventually(t, 20*time.Second, func() bool { return n.q.Stats().StoreUp }, "Redis never marked up again")
	select {
	case <-s.held:
	case <-time.After(20 * time.Second):
		t.Fatal("no heartbeat once Redis was back")
	}
}

// gapNode is a node of permits 1 and local_permits 1 on srv whose
// request p1 was served by its fallback queue while Redis was down, and
// whose heartbeats are held once armed (hb).
func gapNode(t *testing.T, srv *redistest.Server, name string) (*node, *gapBeatStore, *fairqueue.Permit) {
	t.Helper()
	return gapNodeOf(t, srv, name, fairqueue.Config{Permits: 1, LocalPermits: 1}, fairqueue.Request{})
}

// gapNodeOf is gapNode of cfg's capacity (permits, local_permits, fair,
// tenant cap) and p1 of req.
func gapNodeOf(t *testing.T, srv *redistest.Server, name string, cfg fairqueue.Config, req fairqueue.Request) (*node, *gapBeatStore, *fairqueue.Permit) {
	t.Helper()
	hb := &gapBeatStore{held: make(chan struct{}), release: make(chan struct{})}
	// A long lease: no regular heartbeat comes during the test.
	cfg.Fallback, cfg.Lease, cfg.PollInterval, cfg.MaxWait = memstore.New(), 3*time.Minute, 50*time.Millisecond, 20*time.Second
	n := wrappedNode(t, srv, name, cfg, func(s fairqueue.Store) fairqueue.Store { hb.Store = s; return hb })
	hb.up = func() bool { return n.q.Stats().StoreUp }
	t.Cleanup(func() { // before the node closes: its loop may be held in a heartbeat
		select {
		case <-hb.release:
		default:
			close(hb.release)
		}
	})
	p, err := n.q.Acquire(context.Background(), fairqueue.Request{})
	require.NoError(t, err)
	p.Release() // joined

	srv.Kill()
	p1, err := n.q.Acquire(context.Background(), req)
	require.NoError(t, err)
	require.True(t, p1.Local(), "served by the fallback queue while Redis is down")
	t.Cleanup(p1.Release)
	return n, hb, p1
}

// docs/failures.md, "When Redis fails": once Redis answers again, the
// requests that come wait in the fallback queue until the heartbeat that
// has Redis count the local permits still running; Redis would grant
// them beside those permits. A reload during the outage that sets
// on_store_error fail_closed (or fail_open) must not lift that: here
// the local permit p1 runs (permits 1), the reload lands, Redis comes
// back, and the request that comes before the heartbeat (held) was
// granted by Redis, which did not count p1: two requests at once on an
// upstream of permits 1 (as with a reload that kept local: "local").
func TestARequestAfterAReloadThatDroppedTheFallbackWaitsForTheHeartbeatThatCountsItsPermits(t *testing.T) {
	t.Parallel() // its own redis-server: it waits on it, not on the CPU
	for _, policy := range []string{"local", "fail_closed", "fail_open"} {
		t.Run(policy, func(t *testing.T) {
			t.Parallel()
			srv := redistest.Start(t)
			name := "fbgapreload" + policy
			n, hb, p1 := gapNode(t, srv, name)

			reloaded := n.q.Config()
			if policy != "local" { // local: a reload that keeps the fallback queue
				reloaded.Fallback, reloaded.LocalPermits, reloaded.FailOpen = nil, 0, policy == "fail_open"
			}
			require.NoError(t, n.q.Reconfigure(reloaded))
			hb.intoTheGap(t, n, srv)

			r2 := make(chan acquired, 1)
			go func() {
				p, err := n.q.Acquire(context.Background(), fairqueue.Request{})
				r2 <- acquired{p: p, err: err}
			}()
			select {
			case r := <-r2:
				if r.p != nil {
					r.p.Release()
					t.Fatalf("a request was granted (local %v, fail_open %v) beside the local permit that Redis did not count yet: 2 at once under permits 1",
						r.p.Local(), r.p.FailOpen())
				}
				t.Fatalf("a request was refused while Redis answered: %v", r.err)
			case <-time.After(time.Second):
			}

			// The heartbeat has Redis count p1; the request waits there
			// behind it, and is granted by Redis once p1 ends.
			close(hb.release)
			rdb := srv.Client(t)
			eventually(t, 20*time.Second, func() bool {
				return slices.Equal(readState(t, rdb, name).Holders, []string{p1.Ticket()})
			}, "Redis never counted the local permit alone")
			select {
			case r := <-r2:
				if r.p != nil {
					r.p.Release()
				}
				t.Fatalf("the request was answered while p1 held the one permit: %v", r.err)
			case <-time.After(300 * time.Millisecond):
			}
			p1.Release()
			var r acquired
			select {
			case r = <-r2:
			case <-time.After(20 * time.Second):
				t.Fatal("the request was never answered once p1 ended")
			}
			var re *fairqueue.RejectError
			if errors.As(r.err, &re) {
				t.Fatalf("the request was refused %s while Redis was up", re.Reason)
			}
			require.NoError(t, r.err)
			defer r.p.Release()
			assert.False(t, r.p.Local(), "served by the fallback queue")
			assert.False(t, r.p.FailOpen(), "admitted without Redis")
		})
	}
}
