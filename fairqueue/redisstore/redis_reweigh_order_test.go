package redisstore_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
	"github.com/fair-queue/caddy-fair-queue/fairqueue/redisstore"
	"github.com/fair-queue/caddy-fair-queue/internal/redistest"
)

// gatedRequeue holds every Requeue call until open is closed: the moment
// between a grant and the engine's requeue of it reaching the store,
// which a loaded machine stretches.
type gatedRequeue struct {
	fairqueue.Store
	open chan struct{}
	once *sync.Once
}

// let opens the gate (once).
func (g gatedRequeue) let() { g.once.Do(func() { close(g.open) }) }

func (g gatedRequeue) Requeue(ctx context.Context, t fairqueue.RequeueArgs) (fairqueue.AcquireResult, error) {
	<-g.open
	return g.Store.Requeue(ctx, t)
}

// A request queued clamped to kv_tokens 5 (7 tokens), at the head, is
// granted after a reload raised kv_tokens to 8: granted weighing 5, it
// waits again weighing 7 (Permit.reweigh). A later request must not run
// before it meanwhile (strict FIFO: nothing passes the head), found by
// the model under faults (seed 12804854341047270912).
func TestReweighedHeadIsNotPassedByALaterRequestRedis(t *testing.T) {
	srv := redistest.Start(t)
	st := redisstore.New(srv.Client(t), "reweigh", redisstore.Options{})
	state := func() fairqueue.Snapshot {
		s, err := st.Inspect(context.Background(), 10, 10)
		require.NoError(t, err)
		return s
	}
	g := gatedRequeue{Store: st, open: make(chan struct{}), once: new(sync.Once)}
	cfg := fairqueue.Config{Name: "reweigh", Permits: 2, KVTokens: 5, MaxWait: time.Minute,
		PollInterval: 50 * time.Millisecond}
	q, err := fairqueue.New(g, cfg)
	require.NoError(t, err)
	defer func() { _ = q.Close() }()
	defer g.let() // before Close: a requeue held at the gate ends
	ctx := context.Background()

	a, err := q.Acquire(ctx, fairqueue.Request{Tokens: 1})
	require.NoError(t, err)
	b, err := q.Acquire(ctx, fairqueue.Request{Tokens: 3})
	require.NoError(t, err)
	type answer struct {
		p   *fairqueue.Permit
		err error
	}
	acquire := func(tokens, waiting int) chan answer {
		ch := make(chan answer, 1)
		go func() {
			p, err := q.Acquire(ctx, fairqueue.Request{Tokens: tokens})
			ch <- answer{p, err}
		}()
		require.Eventually(t, func() bool { return state().Waiting == waiting },
			10*time.Second, 5*time.Millisecond, "queued")
		return ch
	}
	heavy := acquire(7, 1) // clamped to 5
	later := acquire(2, 2)

	cfg.KVTokens = 8
	require.NoError(t, q.Reconfigure(cfg))
	b.Release() // 1 held: room for the head
	a.Release() // the head's room: nothing else
	require.Len(t, state().Holders, 1,
		"a later request was granted past the head (7 tokens of 8, clamped to 5 when it queued): holders %v, waiting %v",
		state().Holders, state().Waiting)
	g.let()

	var h answer
	select {
	case h = <-heavy:
	case l := <-later:
		t.Fatalf("the later request ran before the head: %v %v", l.p, l.err)
	case <-time.After(30 * time.Second):
		t.Fatal("the head was not granted")
	}
	require.NoError(t, h.err)
	require.Equal(t, 7, h.p.Tokens())
	h.p.Release()
	l := <-later
	require.NoError(t, l.err)
	l.p.Release()
}
