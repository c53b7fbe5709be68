package memstore_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
	"github.com/fair-queue/caddy-fair-queue/fairqueue/memstore"
)

// heldOpen is a Store whose Open waits until the test lets it go (a
// slow subscription), and which records the permits of each Acquire.
type heldOpen struct {
	*memstore.Store
	entered, let chan struct{}
	permits      chan int
}

func (h *heldOpen) Open(ctx context.Context, node string, l fairqueue.Listener) error {
	close(h.entered)
	<-h.let
	return h.Store.Open(ctx, node, l)
}

func (h *heldOpen) Acquire(ctx context.Context, t fairqueue.TicketArgs) (fairqueue.AcquireResult, error) {
	h.permits <- t.Permits
	return h.Store.Acquire(ctx, t)
}

// A node's first request joins the queue (Store.Open) before its
// acquire goes out: the acquire carries the settings in force once the
// node has joined, not those read before, so that a reload while the
// join was on its way (a slow store, other requests waiting for that
// join) holds for it: it does not start the request beside the holder
// the new permits allow.
func TestTheFirstAcquireAfterAJoinCarriesAReloadsPermits(t *testing.T) {
	st := memstore.New()
	cfg := fairqueue.Config{Name: "joinreload", Permits: 2, MaxWait: time.Minute, PollInterval: 50 * time.Millisecond}
	b, err := fairqueue.New(st, cfg)
	require.NoError(t, err)
	defer func() { _ = b.Close() }()
	holder, err := b.Acquire(context.Background(), fairqueue.Request{})
	require.NoError(t, err)

	h := &heldOpen{Store: st, entered: make(chan struct{}), let: make(chan struct{}), permits: make(chan int, 4)}
	a, err := fairqueue.New(h, cfg)
	require.NoError(t, err)
	defer func() { _ = a.Close() }()
	got := make(chan *fairqueue.Permit, 1)
	go func() {
		p, err := a.Acquire(context.Background(), fairqueue.Request{})
		if err != nil {
			p = nil
		}
		got <- p
	}()
	<-h.entered
	lowered := cfg
	lowered.Permits = 1
	require.NoError(t, a.Reconfigure(lowered))
	require.NoError(t, b.Reconfigure(lowered))
	close(h.let)
	assert.Equal(t, 1, <-h.permits, "the acquire after the join carried the permits before the reload")
	require.Eventually(t, func() bool { s := st.State(); return len(s.Waiting)+len(s.Holders) == 2 }, 10*time.Second, 5*time.Millisecond)
	s := st.State()
	assert.Len(t, s.Holders, 1, "the request started beside the holder under 1 permit: %v", s.Holders)
	holder.Release()
	if p := <-got; p != nil {
		p.Release()
	}
}
