package redisstore_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
	"github.com/fair-queue/caddy-fair-queue/internal/redistest"
)

// A rolling change that gives the queue a learned capacity (or a reload
// that turns it off on one instance): x has `adaptive`, its share
// halved (2 of 4 permits), y has not (all 4). Each grants up to its own
// capacity in force, to any instance's waiters: x's calls up to 2, y's
// up to 4 (docs/adaptive.md). The queue never runs more than the larger,
// 4.
func TestMixedFleetGrantsUpToEachInstancesCapacityNeverAboveTheLarger(t *testing.T) {
	const name = "learnedmixed"
	srv := redistest.Start(t)
	ctx := context.Background()
	x := newNode(t, srv, name, learnedCfg(time.Second, 30*time.Second))
	y := newNode(t, srv, name, fairqueue.Config{Permits: 4, MaxWait: time.Minute, PollInterval: time.Second, Lease: 30 * time.Second})
	refused := func(n *node, why string) {
		t.Helper()
		_, err := n.q.Acquire(ctx, fairqueue.Request{MaxWait: 50 * time.Millisecond})
		var rej *fairqueue.RejectError
		require.ErrorAs(t, err, &rej, why)
	}
	p, err := x.q.Acquire(ctx, fairqueue.Request{}) // x joins the queue
	require.NoError(t, err)
	p.Release()
	x.q.ObserveTTFT("", time.Second) // a breach: the share halves, 2 permits for x
	halved(t, x, "x never heard of the lowered share")

	// x grants up to 2.
	var xs []*fairqueue.Permit
	for range 2 {
		p, err := x.q.Acquire(ctx, fairqueue.Request{})
		require.NoError(t, err)
		xs = append(xs, p)
	}
	refused(x, "x granted a third request under a share of 0.5 of 4 permits")
	// y grants up to its 4, beside x's 2.
	var ys []*fairqueue.Permit
	for range 2 {
		p, err := y.q.Acquire(ctx, fairqueue.Request{})
		require.NoError(t, err, "y, without adaptive, grants up to all of its permits")
		ys = append(ys, p)
	}
	require.Len(t, readState(t, y.rdb, name).Holders, 4)
	refused(y, "y granted a fifth request: above both instances' permits")
	refused(x, "x granted a fifth request")

	// x's waiter: x's releases grant it nothing while 2 or more run, y's
	// grant it up to 4.
	xw := acquireAsync(x, ctx)
	eventually(t, 5*time.Second, func() bool { return len(readState(t, x.rdb, name).Waiting) == 1 }, "x's waiter never queued")
	xs[0].Release() // 3 run, x's capacity is 2: nothing starts
	stillWaiting(t, xw, "x's release granted x's waiter with 3 running under its share of 2")
	ys[0].Release() // 2 run: y's release hands the permit on under y's 4
	got := waitFor(t, xw, "x's waiter")
	require.NoError(t, got.err, "y's release did not hand the permit on to x's waiter")
	require.Len(t, readState(t, y.rdb, name).Holders, 3)
	got.p.Release()
	xs[1].Release()
	ys[1].Release()
}
