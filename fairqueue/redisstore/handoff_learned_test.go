package redisstore_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
	"github.com/fair-queue/caddy-fair-queue/internal/redistest"
)

// A learned capacity that comes down applies to the next grants ("Lowering
// revokes nothing ... only the next grants wait", docs/adaptive.md),
// also to a local handoff: a node that learnt its waiter heads the
// queue before the share went down must not start it on a permit that
// ends while more than the learned permits run. The store's own
// dispatch would not grant it (3 held, 2 allowed).
func TestLocalHandoffKeepsToTheLearnedCapacity(t *testing.T) {
	srv := redistest.Start(t)
	cfg := learnedCfg(10*time.Second, 3*time.Second)
	n := newNode(t, srv, "learnedhandoff", cfg)
	q := n.q
	held, w1, w2Ch, w2 := secondHeadNamed(t, n, "learnedhandoff")
	q.ObserveTTFT("", time.Second) // a breach: the share halves, 2 permits
	halved(t, n, "the share did not move")
	held[1].Release() // 3 still run (held[2], held[3], w1): nothing more may start
	notStarted(t, n, "learnedhandoff", held, w1, w2Ch, w2)
}

// The learned capacity is one value in the store for every node: one
// node's report that brings it down holds for the others' local
// handoffs too, although they have not heard of it (they learn a share
// from their own reports only). A node that learnt its waiter heads the
// queue must not start it on a permit that ends while more than the
// learned permits run: the store's own dispatch would grant nobody.
func TestLocalHandoffKeepsToACapacityAnotherNodeLowered(t *testing.T) {
	const name = "learnedelsewhere"
	srv := redistest.Start(t)
	cfg := learnedCfg(10*time.Second, 3*time.Second)
	a := newNode(t, srv, name, cfg)
	b := newNode(t, srv, name, cfg)
	ctx := context.Background()
	p, err := b.q.Acquire(ctx, fairqueue.Request{}) // b joins the queue
	require.NoError(t, err)
	p.Release()
	held, w1, w2Ch, w2 := secondHeadNamed(t, a, name)
	b.q.ObserveTTFT("", time.Second) // a breach seen by b: the share halves, 2 permits
	halved(t, b, "the share did not move")
	require.Equal(t, 1.0, a.q.Share(), "a has heard nothing of it")

	// 3 still run (held[2], held[3], w1): nothing more may start. The
	// release returns once the store has its answer (a release, or the
	// transfer of a local handoff).
	held[1].Release()
	notStarted(t, a, name, held, w1, w2Ch, w2)
}

// The same where the other node joined after the reply that named the
// head, while the node was alone in the queue (so the reply named its
// waiters in a row): once a heartbeat has shown the node another one in
// the queue, it no longer hands on locally under a learned capacity,
// whose share the newcomer's reports may have lowered.
func TestLocalHandoffKeepsToACapacityLoweredByANodeThatJoinedSince(t *testing.T) {
	const name = "learnedjoined"
	srv := redistest.Start(t)
	cfg := learnedCfg(10*time.Second, 3*time.Second)
	a := newNode(t, srv, name, cfg)
	held, w1, w2Ch, w2 := secondHeadNamed(t, a, name)

	joinAndLower(t, srv, name, cfg) // b joins the queue and halves the share: 2 permits
	eventually(t, 5*time.Second, func() bool { return a.q.Stats().Cluster.Nodes == 2 }, "a's heartbeat never saw b")
	require.Equal(t, 1.0, a.q.Share(), "a has heard nothing of the share")

	held[1].Release() // 3 still run (held[2], held[3], w1): nothing more may start
	notStarted(t, a, name, held, w1, w2Ch, w2)
}

// secondHeadNamed makes n (4 permits) hold 4 permits with two waiters
// behind them, w1 then w2, confirmed alive, and releases one: w1 takes
// it, and the reply names w2 the head (where n may hand on locally). It
// returns the 3 permits still held (the first, released, among them),
// w1, granted, and w2's channel and ticket.
func secondHeadNamed(t *testing.T, n *node, name string) (held []*fairqueue.Permit, w1 got, w2Ch chan got, w2 string) {
	t.Helper()
	held = holdFour(t, n)
	w1Ch, _ := queueWaiter(t, n, name)
	w2Ch, w2 = queueWaiter(t, n, name)
	alive(t, n)       // a heartbeat confirmed n: it may hand on locally
	held[0].Release() // w1 takes it; the reply may name w2 the head
	w1 = <-w1Ch
	require.NoError(t, w1.err)
	return held, w1, w2Ch, w2
}

// notStarted asserts, once a second permit of held ended, that w2 did
// not start: 3 run (held[2], held[3], w1) under a learned capacity of 2
// (4 x 0.5). Then it ends them all, and w2 is served once the count is
// down.
func notStarted(t *testing.T, n *node, name string, held []*fairqueue.Permit, w1 got, w2Ch chan got, w2 string) {
	t.Helper()
	st := readState(t, n.rdb, name)
	assert.NotContains(t, st.Holders, w2, "w2 started with 3 running under a learned capacity of 2 (4 x 0.5)")
	assert.Len(t, st.Holders, 3)
	w1.p.Release()
	held[2].Release()
	held[3].Release()
	got := <-w2Ch
	require.NoError(t, got.err)
	got.p.Release()
}
