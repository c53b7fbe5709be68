package redisstore_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
	"github.com/fair-queue/caddy-fair-queue/internal/redistest"
)

// A fleet where instances join the queue often (a queue named from the
// request is given back after idle and opened again under a new node
// ID; many instances with sporadic traffic): a join comes every half
// HeadsTTL. No reply names heads (nobody waits), so no local handoff
// can meet a lowered share, and nothing may hold a lowering back: the
// learned capacity must come down within a few reports of a breach,
// while the joins keep coming, not once they stop.
func TestJoinsEveryHalfHeadsTTLDoNotHoldTheLearnedShareUp(t *testing.T) {
	const name = "learnedchurn"
	srv := redistest.Start(t)
	cfg := learnedCfg(10*time.Second, 30*time.Second)
	ctx := context.Background()
	visit := func(n *node) { // one request through n: it joins the queue
		p, err := n.q.Acquire(ctx, fairqueue.Request{})
		require.NoError(t, err)
		p.Release()
	}
	a, b := newNode(t, srv, name, cfg), newNode(t, srv, name, cfg)
	visit(a)
	visit(b)
	adapt := adaptKey(a, name)
	lowered := func() bool { return a.rdb.HExists(ctx, adapt, "s:").Val() }

	const reports = 3
	for i := 1; i <= reports && !lowered(); i++ {
		joined := time.Now()
		c := newNode(t, srv, name, cfg) // a new instance joins, and gives the queue back
		visit(c)
		require.NoError(t, c.q.Close())
		time.Sleep(cfg.Adaptive.Interval) // a's next report may go
		a.q.ObserveTTFT("", time.Second)  // a breach seen by a, reported at once
		eventually(t, 5*time.Second, func() bool {
			return lowered() || a.rdb.HGet(ctx, adapt, "n:").Val() == strconv.Itoa(i)
		}, "a's report %d never landed", i)
		time.Sleep(time.Until(joined.Add(fairqueue.HeadsTTL / 2)))
	}
	require.True(t, lowered(), "%d breach reports, no heads named by any reply, and the share never came down (window %v)",
		reports, a.rdb.HGetAll(ctx, adapt).Val())
	halved(t, a, "a never heard of the lowered share")
	// The capacity in force: 2 of the 4 permits.
	for range 2 {
		p, err := a.q.Acquire(ctx, fairqueue.Request{})
		require.NoError(t, err)
		defer p.Release()
	}
	_, err := a.q.Acquire(ctx, fairqueue.Request{MaxWait: 50 * time.Millisecond})
	var rej *fairqueue.RejectError
	require.ErrorAs(t, err, &rej, "a third request was granted under a share of 0.5 of 4 permits")
}

// The node heads were named to lowers the share at once with a report
// of its own, even with another node joined since: it hears of the
// share from its reply, and drops heads chosen before (takeHead). Only
// other nodes' reports wait for its heads to be spent: a persistent
// node among others that join and leave keeps the capacity following
// the backend. Its next waiter still does not start above the lowered
// share.
func TestTheNodeHeadsWereNamedToLowersTheShareAtOnce(t *testing.T) {
	const name = "learnedowner"
	srv := redistest.Start(t)
	cfg := learnedCfg(10*time.Second, 3*time.Second)
	ctx := context.Background()
	a := newNode(t, srv, name, cfg)
	held, w1, w2Ch, w2 := secondHeadNamed(t, a, name) // a, alone, is told w2 heads the queue

	joinBehind(t, srv, name, cfg)    // c joins, behind w2
	a.q.ObserveTTFT("", time.Second) // a breach seen by a, reported at once
	adapt := adaptKey(a, name)
	firstReportLanded(t, a, adapt, "a's report never landed")
	require.True(t, a.rdb.HExists(ctx, adapt, "s:").Val(), "a's own report was held back (window %v)", a.rdb.HGetAll(ctx, adapt).Val())
	halved(t, a, "a never heard of the lowered share")

	held[1].Release() // 3 still run (held[2], held[3], w1): nothing more may start
	notStarted(t, a, name, held, w1, w2Ch, w2)
}
