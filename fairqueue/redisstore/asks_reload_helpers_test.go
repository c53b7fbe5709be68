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

// askedAcrossReload is a rolling reload that raises kv_tokens from 50 to
// 100, on queue name of srv: instance b's request of 70 tokens (clamped
// to 50) waits behind instance a's 10 and 40; a takes the reload first,
// and its release of the 40 grants b's request what it asks (Redis
// counts 70 beside a's 10: TicketArgs.Asks), while b still clamps it to
// 50 (its reweigh leaves it so). Then b takes the reload too, and its
// heartbeat has seen the 80 tokens held. It returns both instances, a's
// permit of 10 and b's of 70, released when the test ends.
func askedAcrossReload(t *testing.T, srv *redistest.Server, name string) (a, b *node, small, heavy *fairqueue.Permit) {
	t.Helper()
	cfg := fairqueue.Config{Permits: 10, KVTokens: 50, Lease: 3 * time.Second, PollInterval: 50 * time.Millisecond,
		MaxWait: 10 * time.Second}
	cfgA, cfgB := cfg, cfg
	cfgA.Fallback, cfgB.Fallback = memstore.New(), memstore.New()
	a = newNode(t, srv, name, cfgA)
	b = newNode(t, srv, name, cfgB)
	ctx := context.Background()
	small, err := a.q.Acquire(ctx, fairqueue.Request{Tokens: 10})
	require.NoError(t, err)
	t.Cleanup(small.Release)
	big, err := a.q.Acquire(ctx, fairqueue.Request{Tokens: 40})
	require.NoError(t, err)
	granted := make(chan *fairqueue.Permit, 1)
	go func() {
		p, err := b.q.Acquire(ctx, fairqueue.Request{Tokens: 70})
		if err != nil {
			t.Errorf("b's request of 70 tokens: %v", err)
		}
		granted <- p
	}()
	eventually(t, 10*time.Second, func() bool { return len(readState(t, a.rdb, name).Waiting) == 1 },
		"b's request of 70 tokens never queued")

	c := a.q.Config()
	c.KVTokens = 100
	require.NoError(t, a.q.Reconfigure(c))
	big.Release() // a's call grants b's request: 10 + 70 of 100
	select {
	case heavy = <-granted:
	case <-time.After(20 * time.Second):
		t.Fatal("b's request was not granted")
	}
	require.NotNil(t, heavy)
	t.Cleanup(heavy.Release)
	c = b.q.Config()
	c.KVTokens = 100
	require.NoError(t, b.q.Reconfigure(c))
	eventually(t, 20*time.Second, func() bool { return b.q.Stats().Cluster.TokensHeld == 80 },
		"b's heartbeat never saw the 80 tokens held (10 of a's, 70 of b's)")
	return a, b, small, heavy
}
