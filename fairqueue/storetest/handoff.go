package storetest

import (
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
)

func init() {
	cases = append(cases, testCase{"ReleaseToAWaiterOfTheSameNodeIsObservedAsAHandoff", handoffObserved})
}

// handoffs is an Observer that records the handoffs.
type handoffs struct {
	mu sync.Mutex
	d  []time.Duration
}

func (o *handoffs) Granted(time.Duration, bool)              {}
func (o *handoffs) Rejected(fairqueue.Reason, time.Duration) {}
func (o *handoffs) StoreError(error)                         {}

func (o *handoffs) Handoff(d time.Duration) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.d = append(o.d, d)
}

func (o *handoffs) seen() []time.Duration {
	o.mu.Lock()
	defer o.mu.Unlock()
	return append([]time.Duration(nil), o.d...)
}

// A release that hands the permit to a waiter of the same node is a
// handoff as one to another node is: the node's Observer sees it once,
// with its latency, from the grant to the waiter's wake-up (an operator's
// handoff panel must not stay empty on a one-node queue). Fair queueing
// rules out the local handoff: the grant is the store's.
func handoffObserved(t *testing.T, h Harness) {
	obs := &handoffs{}
	q := h.NewNode(t, "handoffobs", fairqueue.Config{Permits: 1, Fair: true, MaxWait: time.Minute, Observer: obs})
	p, err := q.Acquire(bg, fairqueue.Request{})
	require.NoError(t, err)
	queued := make(chan struct{})
	got := make(chan *fairqueue.Permit, 1)
	go func() {
		p2, err := q.Acquire(bg, fairqueue.Request{OnQueued: func(fairqueue.Waiting) { close(queued) }})
		assert.NoError(t, err)
		got <- p2
	}()
	select {
	case <-queued:
	case <-time.After(5 * time.Second):
		t.Fatal("the second acquire was not queued")
	}
	assert.Empty(t, obs.seen(), "no handoff yet")
	released := time.Now()
	p.Release()
	p2 := <-got
	require.NotNil(t, p2)
	woken := time.Since(released)
	defer p2.Release()
	eventually(t, 5*time.Second, func() bool { return len(obs.seen()) > 0 }, "the handoff was not observed")
	d := obs.seen()
	require.Len(t, d, 1, "one handoff")
	// The store's clock may count in milliseconds: its grant time is up
	// to one earlier than the release.
	assert.LessOrEqual(t, d[0], woken+2*time.Millisecond, "the handoff took %v, the wake-up %v after the release", d[0], woken)
}
