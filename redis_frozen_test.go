package caddyfairqueue

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"syscall"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/internal/redistest"
)

// frozenMaxWait is the max_wait of the tests on a frozen Redis: far
// above the client's timeouts (about a second), so that a request
// answered by the timeout reject at its max_wait, rather than by
// on_store_error, shows.
const frozenMaxWait = 20 * time.Second

// waitFor waits until req is answered, up to within, and returns how long
// it took from start.
func (req *request) waitFor(t *testing.T, start time.Time, within time.Duration) time.Duration {
	t.Helper()
	select {
	case <-req.done:
	case <-time.After(within):
		t.Fatalf("request not answered within %v", within)
	}
	return time.Since(start)
}

// storeUp reports whether every engine of h reads the store up.
func storeUp(h *Handler) bool {
	for _, e := range h.engineList() {
		if !e.q.Stats().StoreUp {
			return false
		}
	}
	return true
}

// docs/failures.md, "When Redis fails": a frozen Redis (SIGSTOP: the
// connections stay open, nothing answers) never holds a request past its
// max_wait; the request that meets it is answered by on_store_error once
// the client's timeouts run out, and the store is marked down after its
// two failed calls. Each policy's exact answer: fail_closed 503
// store_unavailable, fail_open the upstream without a permit, local the
// upstream on a local permit. Once Redis thaws the store is marked up
// again and the request is granted by Redis.
func TestFrozenRedisIsAnsweredByOnStoreErrorBeforeMaxWait(t *testing.T) {
	for _, tc := range []struct {
		policy  string
		code    int
		reason  string // Fair-Queue-Reason
		outcome string
		ran     bool // the next handler ran
	}{
		{FailClosed, http.StatusServiceUnavailable, "store_unavailable", "store_unavailable", false},
		{FailOpen, http.StatusOK, "", outcomeFailOpen, true},
		{FailLocal, http.StatusOK, "", outcomeGranted, true},
	} {
		t.Run(tc.policy, func(t *testing.T) {
			t.Cleanup(func() { poolEmpty(t) })
			rds := redistest.Start(t)
			name := "frozen-" + tc.policy
			// A lease of minutes: no heartbeat falls in the freeze, only
			// the request's own calls.
			h := provision(t, newContext(t), rds.Addr(), &Handler{Name: name, Permits: 1, OnStoreError: tc.policy,
				MaxWait: caddy.Duration(frozenMaxWait), Lease: caddy.Duration(10 * time.Minute)})
			require.Equal(t, outcomeGranted, newRequest(context.Background(), `{}`).start(h, okHandler).wait(t).placeholder(phOutcome),
				"joined while Redis answers")
			settled(t, h)
			errs := metrics.storeErrors.WithLabelValues(name)
			e0 := testutil.ToFloat64(errs)

			rds.Freeze()
			thawed := false
			t.Cleanup(func() {
				if !thawed {
					rds.Thaw()
				}
			})
			ran := make(chan struct{}, 1)
			next := caddyhttp.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) error {
				ran <- struct{}{}
				w.WriteHeader(http.StatusOK)
				return nil
			})
			start := time.Now()
			req := newRequest(context.Background(), `{}`).start(h, next)
			took := req.waitFor(t, start, 2*frozenMaxWait)
			t.Logf("%s on a frozen Redis: %d %q after %v", tc.policy, req.w.Code, req.w.Header().Get("Fair-Queue-Reason"), took)
			assert.Less(t, took, frozenMaxWait, "answered at or past its max_wait")
			assert.Equal(t, tc.code, req.w.Code)
			assert.Equal(t, tc.reason, req.w.Header().Get("Fair-Queue-Reason"))
			assert.Equal(t, tc.outcome, req.placeholder(phOutcome))
			assert.Equal(t, tc.ran, len(ran) == 1, "the upstream reached")
			assert.False(t, storeUp(h), "the store is marked down once the request's calls failed")
			assert.Greater(t, testutil.ToFloat64(errs), e0, "store_errors_total counts the failed calls")
			settled(t, h)

			rds.Thaw()
			thawed = true
			require.Eventually(t, func() bool { return storeUp(h) }, 15*time.Second, 10*time.Millisecond,
				"the store is marked up again once Redis answers")
			require.Eventually(t, func() bool {
				return newRequest(context.Background(), `{}`).start(h, okHandler).wait(t).placeholder(phOutcome) == outcomeGranted
			}, 15*time.Second, 50*time.Millisecond, "Redis grants again")
		})
	}
}

// docs/failures.md, "When Redis fails": a call cut short by its
// request's own end (here its client gone) is no store failure: it
// neither counts in store_errors_total nor marks the store down, however
// many such calls follow each other on a frozen Redis. A poll_interval
// of 10 s and a lease of minutes keep the instance's own polls and
// heartbeats, which would fail on the frozen Redis, out of the freeze
// (about 2.5 s): where the setup took so long that the next poll could
// fall in it, the freeze waits until that poll has passed.
func TestCallsCutShortByTheirClientOnAFrozenRedisAreNoStoreFailure(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	rds := redistest.Start(t)
	const name = "frozen-cut-short"
	const poll = 10 * time.Second // the freeze below lasts about 2.5 s
	h := provision(t, newContext(t), rds.Addr(), &Handler{Name: name, Permits: 1, OnStoreError: FailClosed,
		MaxWait: caddy.Duration(poll), PollInterval: caddy.Duration(poll),
		Lease: caddy.Duration(10 * time.Minute)})
	// The instance joins its queue during its first request, and polls
	// every poll from then on.
	joining := time.Now()
	require.Equal(t, outcomeGranted, newRequest(context.Background(), `{}`).start(h, okHandler).wait(t).placeholder(phOutcome))
	joined := time.Now()
	settled(t, h)
	errs := metrics.storeErrors.WithLabelValues(name)
	e0 := testutil.ToFloat64(errs)

	// Should its next poll come within half a poll (a slow setup), the
	// freeze waits until that poll has passed: the one after is a poll
	// away.
	if k := time.Since(joining)/poll + 1; time.Until(joining.Add(k*poll)) < poll/2 {
		time.Sleep(time.Until(joined.Add(k*poll + 100*time.Millisecond)))
	}
	rds.Freeze()
	thawed := false
	t.Cleanup(func() {
		if !thawed {
			rds.Thaw()
		}
	})
	for i := range 3 {
		ctx, cancel := context.WithCancel(context.Background())
		gone := newRequest(ctx, `{}`).start(h, okHandler)
		time.AfterFunc(100*time.Millisecond, cancel)
		gone.wait(t)
		cancel()
		assert.Equal(t, outcomeCancelled, gone.placeholder(phOutcome), "client gone %d", i)
	}
	// Whatever the requests left to do in the background (their cancels)
	// has had time to fail: twice the client's timeouts.
	time.Sleep(2 * time.Second)
	assert.True(t, storeUp(h), "calls cut short by their requests marked the store down")
	assert.Equal(t, e0, testutil.ToFloat64(errs), "calls cut short by their requests counted in store_errors_total")

	rds.Thaw()
	thawed = true
	// A call that reached Redis once it thawed may have been granted to
	// nobody: the instance gives that permit back at its next poll.
	start := time.Now()
	r := newRequest(context.Background(), `{}`).start(h, okHandler)
	r.waitFor(t, start, 3*poll)
	assert.Equal(t, outcomeGranted, r.placeholder(phOutcome), "Redis grants again")
	assert.True(t, storeUp(h))
}

// docs/failures.md, "When Redis fails": on Redis Cluster the client
// follows a timed-out call to the slot's master a few more times, so a
// frozen cluster is answered later than a frozen server (about 2.7 s),
// yet still by on_store_error and before max_wait; a max_wait shorter
// than that still bounds the request, which gets the timeout reject.
func TestFrozenRedisClusterIsAnsweredBeforeMaxWait(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	cluster := redistest.StartCluster(t, 3)
	seeds := cluster.Addrs()
	ctx := newContext(t)
	mk := func(name string, maxWait time.Duration) *Handler {
		return provision(t, ctx, "", &Handler{Name: name, Permits: 1, OnStoreError: FailClosed,
			MaxWait: caddy.Duration(maxWait), Lease: caddy.Duration(10 * time.Minute),
			Redis: &RedisConfig{Mode: ModeCluster, Addresses: seeds[:1]}})
	}
	long := mk("frozen-cluster-long", frozenMaxWait)
	short := mk("frozen-cluster-short", time.Second)
	for _, h := range []*Handler{long, short} {
		require.Equal(t, outcomeGranted, newRequest(context.Background(), `{}`).start(h, okHandler).wait(t).placeholder(phOutcome))
		settled(t, h)
	}

	for _, n := range cluster.Nodes() {
		n.Freeze()
	}
	thawed := false
	thaw := func() {
		if !thawed {
			thawed = true
			for _, n := range cluster.Nodes() {
				n.Thaw()
			}
		}
	}
	t.Cleanup(thaw)
	for _, tc := range []struct {
		h       *Handler
		maxWait time.Duration
		code    int
		reason  string
	}{
		{short, time.Second, http.StatusTooManyRequests, "timeout"},
		{long, frozenMaxWait, http.StatusServiceUnavailable, "store_unavailable"},
	} {
		start := time.Now()
		req := newRequest(context.Background(), `{}`).start(tc.h, okHandler)
		took := req.waitFor(t, start, 2*frozenMaxWait)
		t.Logf("max_wait %v on a frozen cluster: %d %q after %v", tc.maxWait, req.w.Code, req.w.Header().Get("Fair-Queue-Reason"), took)
		assert.Less(t, took, tc.maxWait+500*time.Millisecond, "answered past its max_wait")
		assert.Equal(t, tc.code, req.w.Code)
		assert.Equal(t, tc.reason, req.w.Header().Get("Fair-Queue-Reason"))
	}
	thaw()
	for _, h := range []*Handler{long, short} {
		require.Eventually(t, func() bool {
			return newRequest(context.Background(), `{}`).start(h, okHandler).wait(t).placeholder(phOutcome) == outcomeGranted
		}, 15*time.Second, 50*time.Millisecond, "Redis grants again")
	}
}

// hangingAddr returns an address whose connections hang: a listener
// with a backlog of one that never accepts, its backlog taken, so that
// the kernel drops every further SYN (a firewall that drops, a host
// gone from the network).
func hangingAddr(t *testing.T) string {
	t.Helper()
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM, 0)
	require.NoError(t, err)
	t.Cleanup(func() { _ = syscall.Close(fd) })
	require.NoError(t, syscall.Bind(fd, &syscall.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}))
	require.NoError(t, syscall.Listen(fd, 0))
	sa, err := syscall.Getsockname(fd)
	require.NoError(t, err)
	addr := fmt.Sprintf("127.0.0.1:%d", sa.(*syscall.SockaddrInet4).Port)
	c, err := net.DialTimeout("tcp", addr, 5*time.Second) // takes the backlog
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })
	_, err = net.DialTimeout("tcp", addr, 100*time.Millisecond)
	require.Error(t, err, "a connection to the full listener was not left hanging")
	return addr
}

// docs/failures.md, "When Redis fails": where connecting to Redis hangs
// (dropped SYNs), a request is answered by on_store_error (fail_closed:
// 503 store_unavailable) after the dial timeouts, before its max_wait:
// also the first request of an instance, which waits for the join
// (bounded by the store's timeout, not its max_wait). The store reads
// down from then on, and the next request is answered alike.
func TestHangingConnectToRedisIsAnsweredByOnStoreErrorBeforeMaxWait(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	const name = "hanging-connect"
	ctx := newContext(t)
	h := provision(t, ctx, hangingAddr(t), &Handler{Name: name, Permits: 1,
		OnStoreError: FailClosed, MaxWait: caddy.Duration(frozenMaxWait)})
	for i := range 2 {
		start := time.Now()
		req := newRequest(context.Background(), `{}`).start(h, okHandler)
		took := req.waitFor(t, start, 2*frozenMaxWait)
		t.Logf("request %d: %d %q after %v", i, req.w.Code, req.w.Header().Get("Fair-Queue-Reason"), took)
		assert.Less(t, took, frozenMaxWait, "answered at or past its max_wait")
		assert.Equal(t, http.StatusServiceUnavailable, req.w.Code, "request %d", i)
		assert.Equal(t, "store_unavailable", req.w.Header().Get("Fair-Queue-Reason"), "request %d", i)
		up, ok := gauge(t, ctx.GetMetricsRegistry(), "caddy_fair_queue_store_up", name)
		assert.True(t, ok && up == 0, "store_up reads %v (reported %v) after request %d", up, ok, i)
		assert.NotEmpty(t, h.engineList())
		assert.False(t, storeUp(h), "the admin API reads the store down after request %d", i)
	}
}
