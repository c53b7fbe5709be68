package fairqueue_test

import (
	"context"
	"errors"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
	"github.com/fair-queue/caddy-fair-queue/fairqueue/memstore"
)

// heldTransfers is an in-process store that takes local handoffs: each
// transfer reports its waiter on moved and then waits until the test
// lets it go (let closed, or with gate set, one value on gate) or, with
// fail set, fails at once. Its releases
// wait for holdReleases to close. It records every acquire's ticket and
// every heartbeat's held permits.
type heldTransfers struct {
	*memstore.Store
	moved        chan string
	let          chan struct{}
	gate         chan struct{}
	fail         atomic.Bool
	holdReleases chan struct{}

	mu   sync.Mutex
	ids  []string
	held [][]string
}

func newHeldTransfers() *heldTransfers {
	return &heldTransfers{Store: memstore.New(), moved: make(chan string, 8), let: make(chan struct{}),
		holdReleases: make(chan struct{})}
}

func (s *heldTransfers) Acquire(ctx context.Context, t fairqueue.TicketArgs) (fairqueue.AcquireResult, error) {
	s.mu.Lock()
	s.ids = append(s.ids, t.ID)
	s.mu.Unlock()
	return s.Store.Acquire(ctx, t)
}

func (s *heldTransfers) Heartbeat(ctx context.Context, hb fairqueue.HeartbeatArgs) (fairqueue.HeartbeatResult, error) {
	s.mu.Lock()
	s.held = append(s.held, slices.Clone(hb.Held))
	s.mu.Unlock()
	return s.Store.Heartbeat(ctx, hb)
}

func (s *heldTransfers) Release(ctx context.Context, t fairqueue.TicketArgs) error {
	select {
	case <-s.holdReleases:
	case <-ctx.Done():
		return ctx.Err()
	}
	return s.Store.Release(ctx, t)
}

func (s *heldTransfers) Transfer(ctx context.Context, t fairqueue.TicketArgs, to string) error {
	s.moved <- to
	if s.fail.Load() {
		return errors.New("transfer lost")
	}
	let := s.let
	if s.gate != nil {
		let = s.gate
	}
	select {
	case <-let:
	case <-ctx.Done():
		return ctx.Err()
	}
	return nil
}

// queueWithWaiters opens a queue of 2 permits on st, takes both, and
// queues two waiters (held until the test ends); it returns the permits
// and the waiters' tickets, once the node is confirmed alive.
func queueWithWaiters(t *testing.T, st *heldTransfers) (*fairqueue.Queue, [2]*fairqueue.Permit, [2]string) {
	q, err := fairqueue.New(st, fairqueue.Config{Name: "heads", Permits: 2, Lease: time.Second,
		PollInterval: 50 * time.Millisecond, MaxWait: time.Minute, StoreTimeout: 10 * time.Second})
	require.NoError(t, err)
	var ps [2]*fairqueue.Permit
	for i := range ps {
		ps[i], err = q.Acquire(context.Background(), fairqueue.Request{})
		require.NoError(t, err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	for i := range 2 {
		go func() {
			if p, err := q.Acquire(ctx, fairqueue.Request{}); err == nil {
				<-ctx.Done()
				p.Release()
			}
		}()
		require.Eventually(t, func() bool { return q.Stats().Waiting == i+1 }, 5*time.Second, time.Millisecond)
	}
	// Confirmed alive: the join, and a heartbeat after it.
	require.Eventually(t, func() bool {
		st.mu.Lock()
		defer st.mu.Unlock()
		return len(st.held) >= 3
	}, 10*time.Second, time.Millisecond)
	st.mu.Lock()
	defer st.mu.Unlock()
	return q, ps, [2]string{st.ids[2], st.ids[3]}
}

// A reply that names again a waiter a local handoff has started, its
// transfer still on its way, leaves that waiter to its transfer: the next
// handoff takes the next waiter, and no heartbeat names the first held
// meanwhile (the store would count it beside the holder it replaces).
func TestARepliedHeadWhoseTransferIsOnItsWayStaysMoving(t *testing.T) {
	st := newHeldTransfers()
	close(st.holdReleases)
	q, ps, w := queueWithWaiters(t, st)
	t.Cleanup(func() { close(st.let); _ = q.Close() })

	q.Heads(w[:], 2, time.Now())
	go ps[0].Release()
	require.Equal(t, w[0], <-st.moved, "a local handoff to the first waiter")
	q.Heads(w[:], 2, time.Now()) // a reply made before that transfer reached the store
	go ps[1].Release()
	st.mu.Lock()
	beats := len(st.held)
	st.mu.Unlock()
	// Two heartbeats later (a lease of 1s: one every 333ms).
	require.Eventually(t, func() bool {
		st.mu.Lock()
		defer st.mu.Unlock()
		return len(st.held) >= beats+2
	}, 10*time.Second, time.Millisecond)
	st.mu.Lock()
	defer st.mu.Unlock()
	for _, h := range st.held[beats:] {
		assert.NotContains(t, h, w[0], "a heartbeat named held the waiter whose transfer is on its way")
	}
}

// After a local handoff whose transfer failed, the store may still have
// its waiter waiting: the next permit that ends does not hand on to the
// waiter behind it (the store would number that grant first), but
// releases through the store.
func TestNoLocalHandoffPassesAWaiterWhoseTransferFailed(t *testing.T) {
	st := newHeldTransfers()
	st.fail.Store(true)
	q, ps, w := queueWithWaiters(t, st)
	t.Cleanup(func() { close(st.holdReleases); close(st.let); _ = q.Close() })

	q.Heads(w[:], 2, time.Now())
	ps[0].Release() // hands on to w[0]; the transfer fails, the release of ps[0] waits
	require.Equal(t, w[0], <-st.moved)
	go ps[1].Release()
	select {
	case to := <-st.moved:
		t.Fatalf("handed on to %s while %s, whose transfer failed, may still wait in the store", to, w[0])
	case <-time.After(300 * time.Millisecond):
	}
}

// The release whose transfer is on its way when other permits end and
// queue theirs behind it returns once its own transfer is done: it does
// not send theirs (a library caller's Release would wait a round trip
// for each).
func TestAReleaseDoesNotWaitForTheTransfersQueuedBehindItsOwn(t *testing.T) {
	st := newHeldTransfers()
	st.gate = make(chan struct{})
	close(st.holdReleases)
	q, ps, w := queueWithWaiters(t, st)
	t.Cleanup(func() { close(st.gate); close(st.let); _ = q.Close() })

	q.Heads(w[:], 2, time.Now())
	first := make(chan struct{})
	go func() {
		ps[0].Release()
		close(first)
	}()
	require.Equal(t, w[0], <-st.moved, "a local handoff to the first waiter, its transfer on its way")
	ps[1].Release() // hands on to the second waiter; its transfer queues
	st.gate <- struct{}{}
	require.Equal(t, w[1], <-st.moved, "the queued transfer is sent after the first")
	select {
	case <-first:
	case <-time.After(5 * time.Second):
		t.Fatal("the first Release waits for the transfer queued behind its own")
	}
	st.gate <- struct{}{}
}
