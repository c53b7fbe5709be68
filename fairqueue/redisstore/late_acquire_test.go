package redisstore_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
	"github.com/fair-queue/caddy-fair-queue/internal/redistest"
)

// lateAcquire holds, once armed, the next acquire until go_ is closed,
// then answers it as a client that gave up on the call does (a timeout),
// without sending it: the test sends it to Redis later, as Redis would
// run it late.
type lateAcquire struct {
	fairqueue.Store
	*gate
	kept fairqueue.TicketArgs
}

func (s *lateAcquire) Acquire(ctx context.Context, t fairqueue.TicketArgs) (fairqueue.AcquireResult, error) {
	if !s.hold.Load() {
		return s.Store.Acquire(ctx, t)
	}
	s.kept = t
	s.pass()
	return fairqueue.AcquireResult{}, context.DeadlineExceeded
}

// An instance leaves (Close) while an acquire of its is on its way to a
// slow Redis: the call times out on the instance's side after the leave
// began, and its request gets the shutting_down reject (no cancel: the
// leave is to take out whatever the call did). Redis runs the acquire
// only after the leave: it grants nothing, and does not bring the
// instance back to life. The other instance gets every permit at once,
// and its leave, the last, leaves nothing in Redis.
func TestAcquireRunAfterTheLeaveTakesNothing(t *testing.T) {
	srv := redistest.Start(t)
	const name = "lateacquire"
	cfg := fairqueue.Config{Permits: 2, Lease: 20 * time.Second, StoreTimeout: 200 * time.Millisecond,
		PollInterval: 50 * time.Millisecond, MaxWait: 10 * time.Second}
	late := &lateAcquire{gate: newGate()}
	a := wrappedNode(t, srv, name, cfg, func(s fairqueue.Store) fairqueue.Store { late.Store = s; return late })
	b := newNode(t, srv, name, cfg)
	for _, n := range []*node{a, b} {
		p, err := n.q.Acquire(context.Background(), fairqueue.Request{})
		require.NoError(t, err)
		p.Release()
	}

	late.hold.Store(true)
	answered := make(chan error, 1)
	go func() {
		p, err := a.q.Acquire(context.Background(), fairqueue.Request{})
		if err == nil {
			p.Release()
		}
		answered <- err
	}()
	<-late.entered
	closed := make(chan error, 1)
	go func() { closed <- a.q.Close() }()
	// Let the leave begin: Close waits for the request at most the store
	// timeout, then the leave waits for the call. Sooner, the call's
	// failure would be an ordinary one (its cancel, sent before the
	// leave, tombstones the ticket) and the test would pass on any code.
	time.Sleep(time.Second)
	close(late.go_)
	err := <-answered
	var rej *fairqueue.RejectError
	require.True(t, errors.As(err, &rej), "not a reject: %v", err)
	require.Equal(t, fairqueue.ReasonShuttingDown, rej.Reason)
	require.NoError(t, <-closed)
	require.NotContains(t, readState(t, srv.Client(t), name).Nodes, a.q.Node(), "a left")

	// Redis runs the acquire now, after a's leave.
	_, err = late.Store.Acquire(context.Background(), late.kept)
	require.NoError(t, err)
	st := readState(t, srv.Client(t), name)
	assert.NotContains(t, st.Holders, late.kept.ID, "an acquire run after its node's leave took a permit for nobody")
	assert.NotContains(t, st.Waiting, late.kept.ID, "an acquire run after its node's leave queued a ticket for nobody")
	assert.NotContains(t, st.Nodes, a.q.Node(), "an acquire run after its node's leave brought it back to life")
	var held []*fairqueue.Permit
	for range cfg.Permits {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		p, err := b.q.Acquire(ctx, fairqueue.Request{})
		cancel()
		if err == nil {
			held = append(held, p)
		}
	}
	assert.Len(t, held, cfg.Permits, "b got fewer than the permits: Redis counts a's late acquire")
	for _, p := range held {
		p.Release()
	}
	require.NoError(t, b.q.Close())
	assert.Empty(t, srv.Keys(t, "*"), "keys left after the last instance left")
}
