package storetest

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
)

// A request queued clamped to kv_tokens 5 (7 tokens), at the head, is
// granted after a reload raised kv_tokens to 8: the store weighs it by
// what it asks (TicketArgs.Asks) at once, and a later request that fits
// beside its old weight (2 of the 3 tokens left by 5) does not run
// before it, also while the node's requeue of it (Permit.reweigh) is
// held on its way (strict FIFO: nothing passes the head). Found by the
// model under faults (seed 12804854341047270912).
func init() {
	cases = append(cases, testCase{"TokensAReweighedHeadIsNotPassedByALaterRequest", tokensReweighOrder})
}

// gatedRequeue holds every Requeue call until let: the moment between a
// grant and the node's requeue of it reaching the store, which a loaded
// machine stretches.
type gatedRequeue struct {
	fairqueue.Store
	open chan struct{}
	once sync.Once
}

// let opens the gate (once).
func (g *gatedRequeue) let() { g.once.Do(func() { close(g.open) }) }

func (g *gatedRequeue) Requeue(ctx context.Context, t fairqueue.RequeueArgs) (fairqueue.AcquireResult, error) {
	<-g.open
	return g.Store.Requeue(ctx, t)
}

func tokensReweighOrder(t *testing.T, h Harness) {
	if h.Store == nil {
		t.Skip("the harness drives no Store directly")
	}
	const name = "reweigh-order"
	g := &gatedRequeue{Store: h.Store(t, name), open: make(chan struct{})}
	cfg := fairqueue.Config{Name: name, Permits: 2, KVTokens: 5, MaxWait: time.Minute,
		PollInterval: 50 * time.Millisecond}
	q, err := fairqueue.New(g, cfg)
	require.NoError(t, err)
	defer func() { _ = q.Close() }()
	defer g.let() // before Close: a requeue held at the gate ends

	a, err := q.Acquire(bg, fairqueue.Request{Tokens: 1})
	require.NoError(t, err)
	b, err := q.Acquire(bg, fairqueue.Request{Tokens: 3})
	require.NoError(t, err)
	type answer struct {
		p   *fairqueue.Permit
		err error
	}
	acquire := func(tokens, waiting int) chan answer {
		ch := make(chan answer, 1)
		go func() {
			p, err := q.Acquire(bg, fairqueue.Request{Tokens: tokens})
			ch <- answer{p, err}
		}()
		require.Eventually(t, func() bool { w, _ := h.State(t, name); return len(w) == waiting },
			10*time.Second, 5*time.Millisecond, "queued")
		return ch
	}
	heavy := acquire(7, 1) // clamped to 5
	later := acquire(2, 2)

	cfg.KVTokens = 8
	require.NoError(t, q.Reconfigure(cfg))
	b.Release() // 1 held: room for the head
	a.Release() // the head's room: nothing else
	waiting, holders := h.State(t, name)
	require.Len(t, holders, 1,
		"a later request was granted past the head (7 tokens of 8, clamped to 5 when it queued): holders %v, waiting %v",
		holders, waiting)
	g.let()

	var hd answer
	select {
	case hd = <-heavy:
	case l := <-later:
		t.Fatalf("the later request ran before the head: %v %v", l.p, l.err)
	case <-time.After(30 * time.Second):
		t.Fatal("the head was not granted")
	}
	require.NoError(t, hd.err)
	require.Equal(t, 7, hd.p.Tokens())
	hd.p.Release()
	l := <-later
	require.NoError(t, l.err)
	l.p.Release()
}
