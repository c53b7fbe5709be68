package redisstore_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
	"github.com/fair-queue/caddy-fair-queue/fairqueue/redisstore"
	"github.com/fair-queue/caddy-fair-queue/internal/redistest"
)

// docs/adaptive.md has operators set a learned share by hand (`HSET
// {fair_queue:<name>}:adapt s: 1`). One mistyped (`1x`) is no share: the
// grant scripts read it as none, at the ceiling, and a report must do
// the same, not fail: until its window ripened (min_samples samples),
// every report failed, each a store error (counted, and a heartbeat sent
// to verify), and the instances heard of no share.
func TestALearnedShareThatIsNoNumberFailsNoReport(t *testing.T) {
	const name = "adapttypo"
	srv := redistest.Start(t)
	rdb := srv.Client(t)
	ctx := context.Background()
	s := redisstore.New(rdb, name, redisstore.Options{})
	require.NoError(t, s.Open(ctx, "a", nopListener{}))
	t.Cleanup(func() { _ = s.Close() })
	key := redisstore.TagOf("", name) + ":adapt"
	for _, field := range []string{"s:", "s:10.0.0.5:8000"} {
		require.NoError(t, rdb.HSet(ctx, key, field, "1x").Err())
	}
	shares, err := s.Adapt(ctx, fairqueue.AdaptArgs{Node: "a", Floor: 0.1, Decrease: 0.5, Step: 0.1,
		BreachShare: 0.1, Interval: time.Hour, MinSamples: 100, Reports: []fairqueue.AdaptReport{{Key: ""}}})
	require.NoError(t, err, "a share set to no number fails every report")
	assert.Empty(t, shares, "a share that is no number is none (the ceiling), as the grant scripts read it")
}
