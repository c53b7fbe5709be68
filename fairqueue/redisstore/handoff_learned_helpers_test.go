package redisstore_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
	"github.com/fair-queue/caddy-fair-queue/fairqueue/redisstore"
	"github.com/fair-queue/caddy-fair-queue/internal/headsttl"
	"github.com/fair-queue/caddy-fair-queue/internal/redistest"
)

// learnedCfg is a queue of 4 permits with a learned capacity that
// halves at once on a breach of its TTFT target (one sample, reported
// every 100 ms), polling and leasing as given.
func learnedCfg(poll, lease time.Duration) fairqueue.Config {
	return fairqueue.Config{Permits: 4, MaxWait: time.Minute, PollInterval: poll, Lease: lease,
		Adaptive: &fairqueue.Adaptive{TargetTTFT: 100 * time.Millisecond, Interval: 100 * time.Millisecond, Decrease: 0.5, MinSamples: 1}}
}

// longHeadsTTL is the heads' lifetime under longHeads: far longer than
// any of the tests that set it takes to reach its check, however loaded
// the machine.
const longHeadsTTL = time.Minute

// longHeads lengthens the lifetime of the heads (fairqueue.HeadsTTL, in
// the queues and the stores) to longHeadsTTL until the test ends, or
// until it calls restore, which brings back the product's: what the
// test checks while heads named earlier may still serve then does not
// hang on the machine's speed. Not for a test that runs in parallel.
func longHeads(t *testing.T) (restore func()) {
	t.Helper()
	restore = headsttl.Lengthen(longHeadsTTL)
	t.Cleanup(restore)
	return restore
}

// holdFour acquires the 4 permits of n's queue.
func holdFour(t *testing.T, n *node) []*fairqueue.Permit {
	t.Helper()
	var held []*fairqueue.Permit
	for range 4 {
		p, err := n.q.Acquire(context.Background(), fairqueue.Request{})
		require.NoError(t, err)
		held = append(held, p)
	}
	return held
}

// halved waits until n has learnt a lowered share (failing with msg),
// and requires it halved.
func halved(t *testing.T, n *node, msg string) {
	t.Helper()
	eventually(t, 5*time.Second, func() bool { return n.q.Share() < 1 }, "%s", msg)
	require.Equal(t, 0.5, n.q.Share())
}

// joinBehind starts another node of queue name, which joins the queue:
// its request, behind the waiters there, gives up at once.
func joinBehind(t *testing.T, srv *redistest.Server, name string, cfg fairqueue.Config) *node {
	t.Helper()
	n := newNode(t, srv, name, cfg)
	_, err := n.q.Acquire(context.Background(), fairqueue.Request{MaxWait: 50 * time.Millisecond})
	var rej *fairqueue.RejectError
	require.ErrorAs(t, err, &rej)
	return n
}

// joinAndLower starts another node of queue name, which joins the queue
// (joinBehind) and, once a newcomer's report may lower the learned
// share (HeadsTTL after it joined), reports a breach: the share halves.
func joinAndLower(t *testing.T, srv *redistest.Server, name string, cfg fairqueue.Config) *node {
	t.Helper()
	b := joinBehind(t, srv, name, cfg)
	time.Sleep(fairqueue.HeadsTTL)
	b.q.ObserveTTFT("", time.Second) // a breach seen by b: the share halves, 2 permits
	eventually(t, 5*time.Second, func() bool { return b.q.Share() < 1 }, "the share did not move")
	return b
}

// adaptKey is the key of queue name's learned-capacity window.
func adaptKey(n *node, name string) string {
	return redisstore.New(n.rdb, name, redisstore.Options{}).Tag() + ":adapt"
}

// firstReportLanded waits until n's first report is in the window
// (counted, or the share it lowered), failing with msg.
func firstReportLanded(t *testing.T, n *node, adapt, msg string) {
	t.Helper()
	ctx := context.Background()
	eventually(t, 5*time.Second, func() bool {
		return n.rdb.HGet(ctx, adapt, "n:").Val() == "1" || n.rdb.HExists(ctx, adapt, "s:").Val()
	}, "%s", msg)
}

// aloneSince waits for a heartbeat of a after left that shows it alone
// in the queue.
func aloneSince(t *testing.T, a *node, left time.Time) {
	t.Helper()
	eventually(t, 5*time.Second, func() bool {
		c := a.q.Stats().Cluster
		return c.At.After(left) && c.Nodes == 1
	}, "no heartbeat of a ran after b left")
}

// beatAfter waits for a heartbeat of n answered after at. The node's
// background loop heartbeats and then reconciles, a dispatch, one after
// the other: the reconcile on its way at at, which may carry the
// settings before a reload at at (a call sent before a reload dispatches
// under them, whenever it lands), has landed by then, and the ones after
// read the settings in force.
func beatAfter(t *testing.T, n *node, at time.Time) {
	t.Helper()
	eventually(t, 10*time.Second, func() bool { return n.q.Stats().Cluster.At.After(at) }, "no heartbeat of the node ran after the reload")
}

// heldHeadsNode is wrappedNode with a heldHeadsStore between the Queue
// and its Redis store.
func heldHeadsNode(t *testing.T, srv *redistest.Server, name string, cfg fairqueue.Config) (*node, *heldHeadsStore) {
	t.Helper()
	hs := &heldHeadsStore{let: make(chan struct{})}
	return wrappedNode(t, srv, name, cfg, func(s fairqueue.Store) fairqueue.Store { hs.Store = s; return hs }), hs
}

// headsOnTheirWay releases held[0] with the next heads the reply names
// held back on their way: w1 takes the permit, and is returned; arrive
// lets the heads reach the node and waits for the release to return.
func headsOnTheirWay(t *testing.T, hs *heldHeadsStore, held []*fairqueue.Permit, w1Ch chan got) (w1 got, arrive func()) {
	t.Helper()
	hs.hold.Store(true) // the next heads wait
	released := make(chan struct{})
	go func() { held[0].Release(); close(released) }() // w1 takes it; the reply names w2, held on its way
	w1 = <-w1Ch
	require.NoError(t, w1.err)
	return w1, func() {
		close(hs.let)
		<-released
	}
}
