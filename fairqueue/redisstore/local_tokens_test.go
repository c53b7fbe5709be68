package redisstore_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
	"github.com/fair-queue/caddy-fair-queue/fairqueue/memstore"
	"github.com/fair-queue/caddy-fair-queue/internal/redistest"
)

// A queue bound by kv_tokens alone (no permits) with local_permits: while
// Redis is unreachable its fallback queue gets the instance's share of
// the tokens (all of them, alone in the cluster), not a share of the
// 1048576 permits that stand for "no permit bound", which left it about
// 1 token: every request clamped to it and run alone.
func TestTokensOnlyFallbackQueueGetsTheNodesShareOfTheTokens(t *testing.T) {
	srv := redistest.Start(t)
	const name = "localtokens"
	cfg := fairqueue.Config{KVTokens: 1000, Fallback: memstore.New(), LocalPermits: 4,
		Lease: 1500 * time.Millisecond, PollInterval: 50 * time.Millisecond, MaxWait: 10 * time.Second}
	a, px := proxiedNode(t, srv, name, cfg)
	p, err := a.q.Acquire(context.Background(), fairqueue.Request{Tokens: 10})
	require.NoError(t, err)
	p.Release()

	px.Cut()
	first, err := a.q.Acquire(context.Background(), fairqueue.Request{Tokens: 300})
	require.NoError(t, err)
	require.True(t, first.Local(), "admitted by the fallback queue")
	defer first.Release()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	second, err := a.q.Acquire(ctx, fairqueue.Request{Tokens: 300})
	require.NoError(t, err, "a second 300-token request waited beside one of 300 under kv_tokens 1000 and local_permits 4")
	require.True(t, second.Local())
	second.Release()
}
