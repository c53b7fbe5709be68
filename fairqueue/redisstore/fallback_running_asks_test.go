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

// A request heavier than kv_tokens 50 (70 tokens, clamped to 50) waits
// on instance B; a reload raises instance A's kv_tokens to 100, and A's
// release grants it what it asks: Redis counts 70 (TicketArgs.Asks),
// beside A's 10. B then takes the reload too, and Redis goes away: B's
// fallback queue, dealt its part of the 100 tokens from the weights its
// requests held at its last heartbeat (70, above its part of 50), must
// count the running request at those 70 too, and admit nothing more:
// counted at its clamped 50, 20 tokens more ran beside it, 120 of 100
// across the instances.
func TestLocalFallbackCountsARunningRequestAtTheWeightRedisGrantedIt(t *testing.T) {
	srv := redistest.Start(t)
	const name = "fbasks"
	cfg := fairqueue.Config{Permits: 10, KVTokens: 50, Lease: 3 * time.Second, PollInterval: 50 * time.Millisecond,
		MaxWait: 10 * time.Second}
	cfgA, cfgB := cfg, cfg
	cfgA.Fallback, cfgB.Fallback = memstore.New(), memstore.New()
	a := newNode(t, srv, name, cfgA)
	b := newNode(t, srv, name, cfgB)
	ctx := context.Background()
	small, err := a.q.Acquire(ctx, fairqueue.Request{Tokens: 10})
	require.NoError(t, err)
	big, err := a.q.Acquire(ctx, fairqueue.Request{Tokens: 40})
	require.NoError(t, err)
	granted := make(chan *fairqueue.Permit, 1)
	go func() {
		p, err := b.q.Acquire(ctx, fairqueue.Request{Tokens: 70})
		if err != nil {
			t.Errorf("B's request of 70 tokens: %v", err)
		}
		granted <- p
	}()
	eventually(t, 10*time.Second, func() bool { return len(readState(t, a.rdb, name).Waiting) == 1 },
		"B's request of 70 tokens never queued")

	c := a.q.Config()
	c.KVTokens = 100
	require.NoError(t, a.q.Reconfigure(c))
	big.Release() // A's call grants B's request: 10 + 70 of 100
	var y *fairqueue.Permit
	select {
	case y = <-granted:
	case <-time.After(20 * time.Second):
		t.Fatal("B's request was not granted")
	}
	require.NotNil(t, y)
	defer y.Release()
	defer small.Release()
	c = b.q.Config()
	c.KVTokens = 100
	require.NoError(t, b.q.Reconfigure(c))
	eventually(t, 20*time.Second, func() bool { return b.q.Stats().Cluster.TokensHeld == 80 },
		"B's heartbeat never saw the 80 tokens held (10 of A's, 70 of B's)")

	srv.Kill()
	eventually(t, 10*time.Second, func() bool {
		if p := tryAcquire(t, b, fairqueue.Request{Tokens: 1}, 100*time.Millisecond); p != nil {
			p.Release()
		}
		return !b.q.Stats().StoreUp
	}, "Redis never marked down")
	if p := tryAcquire(t, b, fairqueue.Request{Tokens: 20}, time.Second); p != nil {
		p.Release()
		t.Fatalf("B's fallback queue admitted 20 tokens beside its request Redis counted at 70 (clamped to 50 " +
			"when it queued), above its part of kv_tokens 100 (50): the 20 tokens free are A's part")
	}
}
