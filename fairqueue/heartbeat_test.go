package fairqueue_test

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
	"github.com/fair-queue/caddy-fair-queue/fairqueue/memstore"
)

// lostReply is a store whose second heartbeat (the first of a node is a
// join, which re-adds nothing) reaches the store but whose reply is
// lost, after the store re-added a ticket of the node that the node had
// released meanwhile (a ghost).
type lostReply struct {
	*memstore.Store
	ghost  string
	once   sync.Once
	readds chan []string // what the lost reply said
}

func (s *lostReply) Heartbeat(ctx context.Context, hb fairqueue.HeartbeatArgs) (fairqueue.HeartbeatResult, error) {
	lost := false
	if hb.Beat >= 2 {
		s.once.Do(func() {
			hb.Held = append(hb.Held, s.ghost)
			lost = true
		})
	}
	res, err := s.Store.Heartbeat(ctx, hb)
	if lost {
		s.readds <- res.Readded
		return fairqueue.HeartbeatResult{}, errors.New("reply lost")
	}
	return res, err
}

// A heartbeat whose reply is lost may have re-added a ticket the node had
// released: the node, though it has no waiter, reconciles until its next
// heartbeat and releases the ghost, so the permit is not held for nobody
// until the lease ends.
func TestGhostOfALostHeartbeatReplyIsReleased(t *testing.T) {
	st := &lostReply{Store: memstore.New(), readds: make(chan []string, 1)}
	// A lease far longer than the wait below: the ghost must not just
	// expire.
	q, err := fairqueue.New(st, fairqueue.Config{Name: "ghost", Permits: 2, Lease: 30 * time.Second,
		PollInterval: 50 * time.Millisecond, MaxWait: time.Second})
	require.NoError(t, err)
	t.Cleanup(func() { _ = q.Close() })
	st.ghost = q.Node() + ":ghost"

	p, err := q.Acquire(context.Background(), fairqueue.Request{}) // held: the node heartbeats
	require.NoError(t, err)
	defer p.Release()
	select {
	case readded := <-st.readds:
		require.Equal(t, []string{st.ghost}, readded, "the store re-added the ghost")
	case <-time.After(5 * time.Second):
		t.Fatal("the node never heartbeated")
	}
	require.Eventually(t, func() bool { return !slices.Contains(st.State().Holders, st.ghost) },
		3*time.Second, 5*time.Millisecond, "the ghost holds a permit for nobody")
	assert.Equal(t, []string{p.Ticket()}, st.State().Holders)
}
