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
	cfg := fairqueue.Config{Permits: 4, MaxWait: time.Minute, PollInterval: 10 * time.Second, Lease: 3 * time.Second,
		Adaptive: &fairqueue.Adaptive{TargetTTFT: 100 * time.Millisecond, Interval: 100 * time.Millisecond, Decrease: 0.5, MinSamples: 1}}
	n := newNode(t, srv, "learnedhandoff", cfg)
	q := n.q
	ctx := context.Background()
	var held []*fairqueue.Permit
	for range 4 {
		p, err := q.Acquire(ctx, fairqueue.Request{})
		require.NoError(t, err)
		held = append(held, p)
	}
	got := make(chan *fairqueue.Permit, 2)
	for range 2 {
		go func() {
			p, err := q.Acquire(ctx, fairqueue.Request{})
			if err == nil {
				got <- p
			}
		}()
		time.Sleep(50 * time.Millisecond) // in this order
	}
	alive(t, n)       // a heartbeat confirmed the node: it may hand on locally
	held[0].Release() // w1 takes it; the reply names w2 the head
	w1 := <-got
	q.ObserveTTFT("", time.Second) // a breach: the share halves, 2 permits
	eventually(t, 5*time.Second, func() bool { return q.Share() < 1 }, "the share did not move")
	require.Equal(t, 0.5, q.Share())
	held[1].Release() // 3 still run (held[2], held[3], w1): nothing more may start
	select {
	case w2 := <-got:
		t.Errorf("w2 started with 3 running under a learned capacity of 2 (4 x 0.5)")
		w2.Release()
	case <-time.After(300 * time.Millisecond):
	}
	w1.Release()
	held[2].Release()
	held[3].Release()
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
	cfg := fairqueue.Config{Permits: 4, MaxWait: time.Minute, PollInterval: 10 * time.Second, Lease: 3 * time.Second,
		Adaptive: &fairqueue.Adaptive{TargetTTFT: 100 * time.Millisecond, Interval: 100 * time.Millisecond, Decrease: 0.5, MinSamples: 1}}
	a := newNode(t, srv, name, cfg)
	b := newNode(t, srv, name, cfg)
	ctx := context.Background()
	p, err := b.q.Acquire(ctx, fairqueue.Request{}) // b joins the queue
	require.NoError(t, err)
	p.Release()
	var held []*fairqueue.Permit
	for range 4 {
		p, err := a.q.Acquire(ctx, fairqueue.Request{})
		require.NoError(t, err)
		held = append(held, p)
	}
	w1Ch, _ := queueWaiter(t, a, name)
	w2Ch, w2 := queueWaiter(t, a, name)
	alive(t, a)       // a heartbeat confirmed a: it may hand on locally
	held[0].Release() // w1 takes it; the reply may name w2 the head
	w1 := <-w1Ch
	require.NoError(t, w1.err)
	b.q.ObserveTTFT("", time.Second) // a breach seen by b: the share halves, 2 permits
	eventually(t, 5*time.Second, func() bool { return b.q.Share() < 1 }, "the share did not move")
	require.Equal(t, 0.5, b.q.Share())
	require.Equal(t, 1.0, a.q.Share(), "a has heard nothing of it")

	// 3 still run (held[2], held[3], w1): nothing more may start. The
	// release returns once the store has its answer (a release, or the
	// transfer of a local handoff).
	held[1].Release()
	st := readState(t, a.rdb, name)
	assert.NotContains(t, st.Holders, w2, "w2 started with 3 running under a learned capacity of 2 (4 x 0.5)")
	assert.Len(t, st.Holders, 3)
	w1.p.Release()
	held[2].Release()
	held[3].Release()
	got := <-w2Ch // served once the count is down
	require.NoError(t, got.err)
	got.p.Release()
}

// The same where the other node joined after the reply that named the
// head, while the node was alone in the queue (so the reply named its
// waiters in a row): once a heartbeat has shown the node another one in
// the queue, it no longer hands on locally under a learned capacity,
// whose share the newcomer's reports may have lowered.
func TestLocalHandoffKeepsToACapacityLoweredByANodeThatJoinedSince(t *testing.T) {
	const name = "learnedjoined"
	srv := redistest.Start(t)
	cfg := fairqueue.Config{Permits: 4, MaxWait: time.Minute, PollInterval: 10 * time.Second, Lease: 3 * time.Second,
		Adaptive: &fairqueue.Adaptive{TargetTTFT: 100 * time.Millisecond, Interval: 100 * time.Millisecond, Decrease: 0.5, MinSamples: 1}}
	a := newNode(t, srv, name, cfg)
	ctx := context.Background()
	var held []*fairqueue.Permit
	for range 4 {
		p, err := a.q.Acquire(ctx, fairqueue.Request{})
		require.NoError(t, err)
		held = append(held, p)
	}
	w1Ch, _ := queueWaiter(t, a, name)
	w2Ch, w2 := queueWaiter(t, a, name)
	alive(t, a)       // a heartbeat confirmed a: it may hand on locally
	held[0].Release() // w1 takes it; the reply names w2 (a is alone)
	w1 := <-w1Ch
	require.NoError(t, w1.err)

	// b joins the queue: its request, behind w2, gives up at once.
	b := newNode(t, srv, name, cfg)
	_, err := b.q.Acquire(ctx, fairqueue.Request{MaxWait: 50 * time.Millisecond})
	var rej *fairqueue.RejectError
	require.ErrorAs(t, err, &rej)
	b.q.ObserveTTFT("", time.Second) // a breach seen by b: the share halves, 2 permits
	eventually(t, 5*time.Second, func() bool { return b.q.Share() < 1 }, "the share did not move")
	eventually(t, 5*time.Second, func() bool { return a.q.Stats().Cluster.Nodes == 2 }, "a's heartbeat never saw b")
	require.Equal(t, 1.0, a.q.Share(), "a has heard nothing of the share")

	held[1].Release() // 3 still run (held[2], held[3], w1): nothing more may start
	st := readState(t, a.rdb, name)
	assert.NotContains(t, st.Holders, w2, "w2 started with 3 running under a learned capacity of 2 (4 x 0.5)")
	assert.Len(t, st.Holders, 3)
	w1.p.Release()
	held[2].Release()
	held[3].Release()
	got := <-w2Ch
	require.NoError(t, got.err)
	got.p.Release()
}
