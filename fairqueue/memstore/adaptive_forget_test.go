package memstore_test

import (
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
	"github.com/fair-queue/caddy-fair-queue/fairqueue/memstore"
	"github.com/fair-queue/caddy-fair-queue/fairqueue/storetest"
)

// A pool whose dials change on every deploy: the store keeps the last
// grant of the upstreams in force only (State lists the upstreams it
// keeps state for), not of every dial the queue ever had.
func TestPoolStateOfUpstreamsNoNodeHasIsForgotten(t *testing.T) {
	s := memstore.New()
	h := storetest.Harness{NewNode: func(t *testing.T, name string, cfg fairqueue.Config) *fairqueue.Queue {
		cfg.Name = name
		q, err := fairqueue.New(s, cfg)
		require.NoError(t, err)
		t.Cleanup(func() { _ = q.Close() })
		return q
	}}
	_, inForce := storetest.RedeployPool(t, h, "poolforget", 10)
	var kept []string
	deadline := time.Now().Add(15 * time.Second)
	for {
		// Until none but those in force is kept: fewer than in force
		// may be kept meanwhile (one not granted on yet) beside an old
		// one still to be forgotten.
		kept = s.State().Upstreams
		old := slices.ContainsFunc(kept, func(u string) bool { return !slices.Contains(inForce, u) })
		if !old || time.Now().After(deadline) {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	require.Subset(t, inForce, kept, "upstreams no node has in its pool are kept")
}
