package redisstore_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
	"github.com/fair-queue/caddy-fair-queue/internal/redistest"
)

// A local handoff whose transfer is on its way when a reload lengthens
// the lease: the heartbeat the new lease sends at once leaves the waiter
// to its transfer (it is moving), and the transfer writes the waiter's
// holder entry with the lease of the release that started it (the old,
// short one). The node's next heartbeat is a third of the new lease
// away, so the entry ends while the request runs and its permit goes to
// a second request: 2 run with 1 permit.
func TestAWaiterStartedAcrossALongerLeaseKeepsItsPermit(t *testing.T) {
	srv := redistest.Start(t)
	ht := &heldTransfers{calls: make(chan string, 8), go_: make(chan struct{})}
	cfg := fairqueue.Config{Permits: 1, MaxWait: 20 * time.Second, Lease: 1200 * time.Millisecond, PollInterval: 50 * time.Millisecond}
	n := wrappedNode(t, srv, "relong", cfg, func(s fairqueue.Store) fairqueue.Store { ht.Store = s; return ht })
	w1, w2Ch, _ := secondInLine(t, n, "relong")
	go w1.p.Release() // local handoff to W2; its transfer is held
	select {
	case <-ht.calls:
	case <-time.After(5 * time.Second):
		t.Fatal("no local handoff")
	}
	w2 := <-w2Ch
	require.NoError(t, w2.err)
	defer w2.p.Release() // W2's request runs until the end of the test

	cfg.Lease = 30 * time.Second // a reload lengthens the lease
	require.NoError(t, n.q.Reconfigure(cfg))
	time.Sleep(300 * time.Millisecond) // its heartbeat, sent at once, ran
	ht.go_ <- struct{}{}               // the transfer lands
	time.Sleep(100 * time.Millisecond)
	t.Logf("W2's holder entry ends in %s", holderExpiry(t, n.rdb, "relong", w2.p.Ticket()))

	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	start := time.Now()
	p, err := n.q.Acquire(ctx, fairqueue.Request{})
	if err == nil {
		p.Release()
		t.Fatalf("a second request ran beside W2 with 1 permit (granted after %s)", time.Since(start).Round(time.Millisecond))
	}
	require.ErrorIs(t, err, context.DeadlineExceeded)
}
