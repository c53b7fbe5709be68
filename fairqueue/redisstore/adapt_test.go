package redisstore_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
	"github.com/fair-queue/caddy-fair-queue/internal/redistest"
)

// A node that never joined the queue (no request came) reports nothing
// it observed, so that nothing of the learned capacity is left behind
// when it closes; once joined, its reports move the share, and its leave
// deletes them with the rest.
func TestLearnedCapacityLeavesNoKeyBehind(t *testing.T) {
	srv := redistest.Start(t)
	cfg := fairqueue.Config{Permits: 4, Adaptive: &fairqueue.Adaptive{TargetTTFT: time.Second, Interval: 100 * time.Millisecond, MinSamples: 1}}
	n := newNode(t, srv, "learnclean", cfg)
	for range 3 {
		n.q.ObserveOverload("", 5) // the backend's gauges, read while no request came
		n.q.ObserveTTFT("", time.Minute)
		time.Sleep(120 * time.Millisecond)
	}
	assert.Empty(t, srv.Keys(t, "*"), "an idle node wrote nothing")
	p, err := n.q.Acquire(t.Context(), fairqueue.Request{})
	require.NoError(t, err)
	p.Release()
	n.q.ObserveTTFT("", time.Minute)
	eventually(t, 5*time.Second, func() bool { return n.q.Share() < 1 }, "the share did not move once joined")
	require.NoError(t, n.q.Close())
	assert.Empty(t, srv.Keys(t, "*"), "keys left after the node left")
}
