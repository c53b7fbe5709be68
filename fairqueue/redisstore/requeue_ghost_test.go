package redisstore_test

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
	"github.com/fair-queue/caddy-fair-queue/internal/redistest"
)

// heldRequeue holds a requeue on its way to Redis, once hold is set,
// until go_ is closed: a slow Redis or network between an upstream's
// refusal and the requeue's landing.
type heldRequeue struct {
	fairqueue.Store
	*gate
}

func (s *heldRequeue) Requeue(ctx context.Context, r fairqueue.RequeueArgs) (fairqueue.AcquireResult, error) {
	s.pass()
	return s.Store.Requeue(ctx, r)
}

// requeueResult is what a Permit.Requeue returned.
type requeueResult struct {
	p   *fairqueue.Permit
	err error
}

// requeueSeenAsGhost requeues p through s under ctx and holds the call
// until a reconcile of n (its new ticket waits: the node reconciles every
// poll interval) has found p's old holder, which the node forgot as the
// requeue left, and released it as a ghost; then it runs between (a
// step of the test's) and lets the requeue land. The Requeue's answer
// comes on the channel returned.
func requeueSeenAsGhost(t *testing.T, ctx context.Context, n *node, s *heldRequeue, name string, p *fairqueue.Permit, cool time.Duration, between func()) <-chan requeueResult {
	t.Helper()
	s.hold.Store(true)
	done := make(chan requeueResult, 1)
	go func() {
		p2, err := p.Requeue(ctx, cool)
		done <- requeueResult{p2, err}
	}()
	<-s.entered
	var once sync.Once
	land := func() { once.Do(func() { close(s.go_) }) }
	t.Cleanup(land) // the node's Close waits for the call
	eventually(t, 10*time.Second, func() bool {
		return !slices.Contains(readState(t, n.rdb, name).Holders, p.Ticket())
	}, "a reconcile releases the old holder the node forgot while its requeue is on its way")
	between()
	land()
	return done
}

// A request whose upstream refused it is requeued; while the requeue is
// on its way, a reconcile finds the old grant among the node's holders,
// unknown to the node (it forgot the ticket as the requeue left), and
// releases it first. The grant ran nowhere all the same: as
// Permit.Requeue promises, its tenant is charged nothing for it,
// whichever of the two reaches Redis first. Tenant l's request of cost 5
// is refused and requeued behind tenant h's, and its client leaves
// while it waits again; l's next request, queued behind three of tenant
// o, is served level with o's: after o's first, not after all three.
func TestARequeueMetByAGhostReleaseChargesItsTenantNothing(t *testing.T) {
	srv := redistest.Start(t)
	cfg := fairqueue.Config{Permits: 1, Fair: true, MaxWait: time.Minute, Lease: 10 * time.Second,
		PollInterval: fairqueue.MinPollInterval}
	s := &heldRequeue{gate: newGate()}
	n := wrappedNode(t, srv, "requeueghost", cfg, func(st fairqueue.Store) fairqueue.Store { s.Store = st; return s })
	ctx := context.Background()

	p, err := n.q.Acquire(ctx, fairqueue.Request{Tenant: "l", Cost: 5})
	require.NoError(t, err)
	time.Sleep(300 * time.Millisecond) // past the window of a grant message in flight
	leaving, leave := context.WithCancel(ctx)
	defer leave()
	var h *fairqueue.Permit
	done := requeueSeenAsGhost(t, leaving, n, s, "requeueghost", p, -1, func() {
		h, err = n.q.Acquire(ctx, fairqueue.Request{Tenant: "h"}) // the permit the ghost release freed
		require.NoError(t, err)
	})
	eventually(t, 10*time.Second, func() bool {
		return len(readState(t, n.rdb, "requeueghost").Waiting) == 1
	}, "the requeued request waits behind h's")
	leave()
	r := <-done
	require.ErrorIs(t, r.err, context.Canceled)
	h.Release()
	eventually(t, 10*time.Second, func() bool {
		st := readState(t, n.rdb, "requeueghost")
		return len(st.Holders) == 0 && len(st.Waiting) == 0
	}, "h's permit is given back, l's waiter gone")

	assertLevel(t, n, "requeueghost", "its upstream refused (its requeue landed after a reconcile released it)")
}

// The upstream that refused a request cools, as Permit.Requeue promises,
// also where a reconcile releases the refused grant while the requeue is
// on its way: the requeued request is not granted on it again at once,
// but waits for the other upstream of the pool.
func TestARequeueMetByAGhostReleaseCoolsTheUpstreamThatRefused(t *testing.T) {
	srv := redistest.Start(t)
	cfg := fairqueue.Config{Permits: 2, MaxWait: time.Minute, Lease: 10 * time.Second,
		PollInterval: fairqueue.MinPollInterval,
		Upstreams:    []fairqueue.Upstream{{Dial: "a:1", Permits: 1}, {Dial: "b:1", Permits: 1}}}
	s := &heldRequeue{gate: newGate()}
	n := wrappedNode(t, srv, "requeueghostcool", cfg, func(st fairqueue.Store) fairqueue.Store { s.Store = st; return s })
	ctx := context.Background()

	p, err := n.q.Acquire(ctx, fairqueue.Request{})
	require.NoError(t, err)
	other, err := n.q.Acquire(ctx, fairqueue.Request{})
	require.NoError(t, err)
	refused := p.Upstream()
	require.NotEmpty(t, refused)
	require.NotEqual(t, refused, other.Upstream())
	time.Sleep(300 * time.Millisecond) // past the window of a grant message in flight
	done := requeueSeenAsGhost(t, ctx, n, s, "requeueghostcool", p, 30*time.Second, func() {})
	eventually(t, 10*time.Second, func() bool {
		st := readState(t, n.rdb, "requeueghostcool")
		return len(st.Waiting) == 1 || len(st.Holders) == 2
	}, "the requeue landed")
	other.Release()
	r := <-done
	require.NoError(t, r.err)
	defer r.p.Release()
	require.NotEqual(t, refused, r.p.Upstream(), "the requeued request is granted again on the upstream that refused it, which should cool")
}
