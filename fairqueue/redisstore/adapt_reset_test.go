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

// A learned share an operator deletes while instances run (HDEL, or
// `purge --queue`) is put back by the next report of an instance that
// knew it, as after Redis lost its data; one the operator sets to 1
// (HSET) stays there: the documented way to start the learned capacity
// from the ceiling again without stopping every instance (adaptive.md).
func TestALearnedShareResetTo1StaysWhileADeletedOneIsPutBack(t *testing.T) {
	const name = "adaptreset"
	srv := redistest.Start(t)
	rdb := srv.Client(t)
	ctx := context.Background()
	s := redisstore.New(rdb, name, redisstore.Options{})
	require.NoError(t, s.Open(ctx, "a", nopListener{}))
	t.Cleanup(func() { _ = s.Close() })
	report := func() float64 {
		shares, err := s.Adapt(ctx, fairqueue.AdaptArgs{Node: "a", Floor: 0.1, Decrease: 0.5, Step: 0.1,
			BreachShare: 0.1, Interval: time.Hour, MinSamples: 100,
			Reports: []fairqueue.AdaptReport{{Key: ""}}, Known: map[string]float64{"": 0.5}})
		require.NoError(t, err)
		if v, ok := shares[""]; ok {
			return v
		}
		return 1
	}
	key := redisstore.TagOf("", name) + ":adapt"
	assert.Equal(t, 0.5, report(), "a share the store lacks starts from the one the instance knew")
	require.NoError(t, rdb.HDel(ctx, key, "s:").Err())
	assert.Equal(t, 0.5, report(), "a deleted share is put back by an instance that knew it")
	require.NoError(t, rdb.HSet(ctx, key, "s:", "1").Err())
	assert.Equal(t, 1.0, report(), "a share set to 1 went back down to what the instance knew")
}
