package redisstore_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
	"github.com/fair-queue/caddy-fair-queue/fairqueue/redisstore"
	"github.com/fair-queue/caddy-fair-queue/internal/redistest"
)

// heldAcquires is a Store whose Acquire of a ticket named in holds
// waits, once in, until the test lets it go, as if the call had been
// slow; done is closed once it has returned.
type heldAcquires struct {
	fairqueue.Store
	mu    sync.Mutex
	holds map[string]*heldCall
}

type heldCall struct {
	entered, let, done chan struct{}
	permits            int
}

func (s *heldAcquires) hold(id string) *heldCall {
	c := &heldCall{entered: make(chan struct{}), let: make(chan struct{}), done: make(chan struct{})}
	s.mu.Lock()
	s.holds[id] = c
	s.mu.Unlock()
	return c
}

func (s *heldAcquires) Acquire(ctx context.Context, t fairqueue.TicketArgs) (fairqueue.AcquireResult, error) {
	s.mu.Lock()
	c := s.holds[t.ID]
	delete(s.holds, t.ID)
	s.mu.Unlock()
	if c == nil {
		return s.Store.Acquire(ctx, t)
	}
	c.permits = t.Permits
	close(c.entered)
	<-c.let
	defer close(c.done)
	return s.Store.Acquire(ctx, t)
}

// closedIn fails the test with msg unless ch is closed within 30 s.
func closedIn(t *testing.T, ch <-chan struct{}, msg string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(30 * time.Second):
		t.Fatal(msg)
	}
}

// The waiters a heartbeat finds the store has lost are queued again one
// after the other, each acquire a round trip: a reload that lands while
// one is on its way must hold for those sent after it, which dispatch
// too. Under the settings read before the first, the last one would
// start a waiter above the permits the reload allows.
func TestWaitersQueuedAgainAfterAReloadKeepToItsPermits(t *testing.T) {
	const name = "reinstatereload"
	srv := redistest.Start(t)
	cfg := fairqueue.Config{Permits: 4, MaxWait: time.Minute, PollInterval: 10 * time.Second, Lease: 3 * time.Second}
	hs := &heldAcquires{holds: map[string]*heldCall{}}
	a := wrappedNode(t, srv, name, cfg, func(s fairqueue.Store) fairqueue.Store { hs.Store = s; return hs })
	held := holdFour(t, a)
	var chs []chan got
	var ws []string
	for range 3 {
		ch, w := queueWaiter(t, a, name)
		chs, ws = append(chs, ch), append(ws, w)
	}
	second, third := hs.hold(ws[1]), hs.hold(ws[2])
	// The store loses the three waiters: the node's heartbeats find them
	// missing and queue them again (the second and third in one go).
	tag := redisstore.New(a.rdb, name, redisstore.Options{}).Tag()
	for _, w := range ws {
		require.NoError(t, a.rdb.ZRem(context.Background(), tag+":waiting", w).Err())
	}

	closedIn(t, second.entered, "the second waiter was not queued again")
	cfg.Permits = 2
	require.NoError(t, a.q.Reconfigure(cfg)) // 2 permits from now on
	close(second.let)                        // 4 run: it grants nobody
	closedIn(t, third.entered, "the third waiter was not queued again")
	held[0].Release() // 3 still run: nothing may start
	require.Len(t, readState(t, a.rdb, name).Holders, 3)
	close(third.let)
	closedIn(t, third.done, "the third waiter's acquire did not return")

	st := readState(t, a.rdb, name)
	for _, w := range ws {
		assert.NotContains(t, st.Holders, w, "a waiter started with 3 running under 2 permits")
	}
	assert.Len(t, st.Holders, 3)
	assert.Equal(t, 2, third.permits, "the acquire sent after the reload carried the permits before it")
	for _, p := range held[1:] {
		p.Release()
	}
	for _, ch := range chs {
		g := <-ch
		require.NoError(t, g.err)
		g.p.Release()
	}
}
