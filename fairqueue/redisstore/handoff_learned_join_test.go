package redisstore_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
	"github.com/fair-queue/caddy-fair-queue/internal/redistest"
)

// The window TestLocalHandoffKeepsToACapacityLoweredByANodeThatJoinedSince
// leaves out: the other node joins and lowers the learned share before
// the node's next heartbeat (a third of a lease away) has shown it the
// newcomer. The node still holds the heads a reply named while it was
// alone; a permit that ends must not start the next one while more than
// the learned permits run.
func TestLocalHandoffKeepsToACapacityLoweredBeforeTheNextHeartbeat(t *testing.T) {
	const name = "learnedjoinedearly"
	srv := redistest.Start(t)
	// A long lease: the node's next heartbeat is 10 s away, and it
	// confirmed the node alive for 15 s.
	cfg := learnedCfg(time.Second, 30*time.Second)
	a := newNode(t, srv, name, cfg)
	held, w1, w2Ch, w2 := secondHeadNamed(t, a, name)

	b := joinAndLower(t, srv, name, cfg)
	require.Equal(t, 1, a.q.Stats().Cluster.Nodes, "a's heartbeat saw b already: not the window under test")
	require.Equal(t, 1.0, a.q.Share(), "a has heard nothing of the share")
	require.Equal(t, 0.5, b.q.Share())

	held[1].Release() // 3 still run (held[2], held[3], w1): nothing more may start
	notStarted(t, a, name, held, w1, w2Ch, w2)
}

// The same where the newcomer has left again when the node's next
// heartbeat runs: that heartbeat shows the node alone in the queue, but
// the share the newcomer lowered stays, and the heads named before it
// joined must not start above it.
func TestLocalHandoffKeepsToACapacityLoweredByANodeThatLeftSince(t *testing.T) {
	const name = "learnedleft"
	srv := redistest.Start(t)
	cfg := learnedCfg(10*time.Second, 3*time.Second)
	a := newNode(t, srv, name, cfg)
	held, w1, w2Ch, w2 := secondHeadNamed(t, a, name)

	b := joinAndLower(t, srv, name, cfg)
	require.NoError(t, b.q.Close()) // b leaves; the share it lowered stays
	aloneSince(t, a, time.Now())
	require.Equal(t, 1.0, a.q.Share(), "a has heard nothing of the share")

	held[1].Release() // 3 still run (held[2], held[3], w1): nothing more may start
	notStarted(t, a, name, held, w1, w2Ch, w2)
}

// While heads a reply named under a learned capacity may still serve
// local handoffs (HeadsTTL from then) and another node is in the queue,
// a report does not lower the queue's share (docs/adaptive.md): the node
// that was alone may still start its waiters locally under the share it
// knows. The report is kept in the window, and the next one after that
// lowers the share.
func TestANewcomersReportLowersTheShareOnceHeadsNamedBeforeItJoinedAreSpent(t *testing.T) {
	const name = "learnednewcomer"
	restore := longHeads(t) // a's heads still serve when b's report lands
	srv := redistest.Start(t)
	cfg := learnedCfg(10*time.Second, 3*time.Second)
	ctx := context.Background()
	a := newNode(t, srv, name, cfg)
	// a, alone, holds 4 permits with w1 and w2 waiting behind them.
	held := holdFour(t, a)
	w1Ch, _ := queueWaiter(t, a, name)
	w2Ch, _ := queueWaiter(t, a, name)
	alive(t, a)
	named := time.Now()
	held[0].Release() // w1 takes it, and the reply names w2 the head
	w1 := <-w1Ch
	require.NoError(t, w1.err)
	namedBy := time.Now() // the heads were named between named and namedBy

	b := joinBehind(t, srv, name, cfg) // b joins, behind w2
	b.q.ObserveTTFT("", time.Second)   // a breach seen by b, reported at once
	adapt := adaptKey(b, name)
	firstReportLanded(t, b, adapt, "b's report never landed")
	require.Less(t, time.Since(named), longHeadsTTL, "b's report landed after a's heads were spent")
	require.Equal(t, 1.0, b.q.Share(), "b's report lowered the share within HeadsTTL of a's heads")
	require.False(t, b.rdb.HExists(ctx, adapt, "s:").Val(), "the store lowered the share within HeadsTTL of a's heads")

	// Back to the product's lifetime, and past it: a's heads are spent.
	restore()
	time.Sleep(time.Until(namedBy.Add(fairqueue.HeadsTTL)))
	b.q.ObserveTTFT("", 10*time.Millisecond) // below the target; the window still holds the breach (1 of 2 over)
	halved(t, b, "the held breach never lowered the share")

	w1.p.Release()
	for _, p := range held[1:] {
		p.Release()
	}
	got := <-w2Ch
	require.NoError(t, got.err)
	got.p.Release()
}
