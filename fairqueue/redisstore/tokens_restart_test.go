package redisstore_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
	"github.com/fair-queue/caddy-fair-queue/internal/redistest"
)

// Redis restarted with its data (AOF) after being down longer than the
// lease, while node a's request of 60 tokens runs (kv_tokens 100): the
// holder's lease and a's membership ran out in the data Redis loads back.
// a's heartbeats keep or count again its request with its weight: once
// they have, b's request of 60 waits for it, and the tokens counted come
// back to nothing once both end (60 held then, not 0 nor 120).
func TestTokensOfAHolderWhoseLeaseRanOutInARestartAreCountedAgain(t *testing.T) {
	srv := redistest.Start(t, redistest.WithArgs("--appendonly", "yes", "--appendfsync", "always"))
	cfg := fairqueue.Config{KVTokens: 100, Lease: 2 * time.Second, MaxWait: time.Minute, PollInterval: 50 * time.Millisecond}
	a, b := newNode(t, srv, "tokrestart", cfg), newNode(t, srv, "tokrestart", cfg)
	pa, err := a.q.Acquire(context.Background(), fairqueue.Request{Tokens: 60})
	require.NoError(t, err)
	require.Equal(t, 60, tsum(t, a, "tokrestart"))

	srv.Kill()
	time.Sleep(3 * time.Second) // past the lease
	srv.Restart()
	eventually(t, 10*time.Second, func() bool {
		snap, err := a.q.Inspect(context.Background(), 10, 0)
		return err == nil && len(snap.Holders) == 1 && tsum(t, a, "tokrestart") == 60
	}, "a's running request not counted again with its 60 tokens (tsum %d)", tsum(t, a, "tokrestart"))

	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	got := make(chan *fairqueue.Permit, 1)
	go func() {
		p, err := b.q.Acquire(ctx, fairqueue.Request{Tokens: 60})
		assert.NoError(t, err)
		got <- p
	}()
	select {
	case <-got:
		t.Fatal("b's 60 tokens granted beside a's 60, above kv_tokens 100")
	case <-time.After(2500 * time.Millisecond): // past a lease: a's request is renewed, not reaped
	}
	pa.Release()
	var pb *fairqueue.Permit
	select {
	case pb = <-got:
	case <-ctx.Done():
		t.Fatal("b not granted once a's request ended")
	}
	require.NotNil(t, pb)
	assert.Equal(t, 60, tsum(t, a, "tokrestart"))
	pb.Release()
	eventually(t, 5*time.Second, func() bool { return tsum(t, a, "tokrestart") == 0 }, "tokens counted once both ended: %d", tsum(t, a, "tokrestart"))
}
