package redisstore_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
	"github.com/fair-queue/caddy-fair-queue/internal/redistest"
)

// passedTransfers is heldTransfers that signals done once a Transfer let
// through has returned. Once quiet is set, its Reconciles wait until
// loud is closed (parked is closed as the first one waits): the node's
// loop, parked there, releases no holder whose transfer is on its way
// as a ghost (the store's dispatch then grants the waiter, running
// already: the holders counted stay those running).
type passedTransfers struct {
	heldTransfers
	done         chan struct{}
	quiet        atomic.Bool
	parked, loud chan struct{}
}

func (p *passedTransfers) Reconcile(ctx context.Context, node string, l fairqueue.Limits) (fairqueue.ReconcileResult, error) {
	if p.quiet.CompareAndSwap(true, false) {
		close(p.parked)
		<-p.loud
		ctx = context.Background() // its deadline passed meanwhile
	}
	return p.Store.Reconcile(ctx, node, l)
}

func (p *passedTransfers) Transfer(ctx context.Context, t fairqueue.TicketArgs, to string) error {
	err := p.heldTransfers.Transfer(ctx, t, to)
	p.done <- struct{}{}
	return err
}

// A node sends its transfers one after the other: one queued behind
// another goes out a round trip (or more) after its release read the
// settings. Its waiter may have been granted by the store meanwhile (the
// transfer before it freed a permit, and the store gave it to the head:
// that waiter, running already); the transfer then frees its holder's
// permit and dispatches. A reload that lowered the permits while the
// transfer waited its turn must hold for that dispatch: under the
// settings read at its release it would start a waiter above the
// permits the reload allows.
func TestATransferQueuedBehindAnotherKeepsToAReloadsPermits(t *testing.T) {
	const name = "transferreload"
	srv := redistest.Start(t)
	cfg := fairqueue.Config{Permits: 4, MaxWait: time.Minute, Lease: 10 * time.Second}
	pt := &passedTransfers{heldTransfers: heldTransfers{calls: make(chan string, 8), go_: make(chan struct{})},
		done: make(chan struct{}, 8), parked: make(chan struct{}), loud: make(chan struct{})}
	a := wrappedNode(t, srv, name, cfg, func(s fairqueue.Store) fairqueue.Store { pt.Store = s; return pt })
	b := newNode(t, srv, name, cfg)
	ctx := context.Background()
	hb, err := b.q.Acquire(ctx, fairqueue.Request{})
	require.NoError(t, err)
	var hs []*fairqueue.Permit
	for range 3 {
		p, err := a.q.Acquire(ctx, fairqueue.Request{})
		require.NoError(t, err)
		hs = append(hs, p)
	}
	// a's three waiters head the queue, b's two follow.
	var ws []chan got
	var ids []string
	for range 3 {
		ch, id := queueWaiter(t, a, name)
		ws, ids = append(ws, ch), append(ids, id)
	}
	b1, b1id := queueWaiter(t, b, name)
	b2, _ := queueWaiter(t, b, name)
	alive(t, a)
	pt.quiet.Store(true)
	<-pt.parked
	defer close(pt.loud)

	// A first release goes through the store: its reply names a's next
	// waiter as the head (one: b is in the queue too).
	hs[0].Release()
	w0 := <-ws[0]
	require.NoError(t, w0.err)
	// The next hands on locally; its transfer is held.
	go hs[1].Release()
	require.Equal(t, ids[1], <-pt.calls)
	w1 := <-ws[1]
	require.NoError(t, w1.err)
	// w0 ends through the store (the head it knew has gone): the store
	// grants w1, running already, and names w2 the head; the last holder
	// hands on to it locally, its transfer queued behind the first.
	w0.p.Release()
	hs[2].Release()
	w2 := <-ws[2]
	require.NoError(t, w2.err)

	lowered := cfg
	lowered.Permits = 2
	require.NoError(t, a.q.Reconfigure(lowered))
	require.NoError(t, b.q.Reconfigure(lowered))
	pt.go_ <- struct{}{} // the first transfer lands (sent before the reload)
	<-pt.done
	require.Equal(t, ids[2], <-pt.calls) // the second goes out after the reload
	pt.go_ <- struct{}{}
	<-pt.done

	// hb, w1 and w2 run; nothing more may start under 2 permits.
	st := readState(t, a.rdb, name)
	assert.NotContains(t, st.Holders, b1id, "b's waiter started with 3 running under 2 permits")
	assert.Len(t, st.Holders, 3)
	hb.Release()
	w1.p.Release()
	w2.p.Release()
	for _, ch := range []chan got{b1, b2} {
		g := <-ch
		require.NoError(t, g.err)
		g.p.Release()
	}
}
