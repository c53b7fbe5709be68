package redisstore_test

import (
	"context"
	"sync"
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

// gatedBeat holds the first Heartbeat that carries lease until open is
// closed: the heartbeat a reload sends at once, on its way.
type gatedBeat struct {
	fairqueue.Store
	lease   time.Duration
	once    sync.Once
	entered chan struct{}
	open    chan struct{}
}

func (g *gatedBeat) Heartbeat(ctx context.Context, hb fairqueue.HeartbeatArgs) (fairqueue.HeartbeatResult, error) {
	first := false
	if hb.Lease == g.lease {
		g.once.Do(func() { first = true })
	}
	if first {
		close(g.entered)
		<-g.open
	}
	return g.Store.Heartbeat(ctx, hb)
}

func (g *gatedBeat) Transfer(ctx context.Context, t fairqueue.TicketArgs, to string) error {
	return g.Store.(fairqueue.Transferrer).Transfer(ctx, t, to)
}

// The same window without a local handoff: another node's release
// grants this node's waiter (pending at the snapshot of the heartbeat a
// reload that lengthens the lease sends at once) before that heartbeat
// reaches Redis, so with the owner's lease Redis still knows, the old
// one; the heartbeat renews only what it named, and the next is a third
// of the new lease away.
func TestAGrantMadeWhileTheLongerLeasesHeartbeatIsOnItsWayKeepsItsPermit(t *testing.T) {
	srv := redistest.Start(t)
	cfg := fairqueue.Config{Permits: 1, MaxWait: 20 * time.Second, Lease: 3 * time.Second, PollInterval: 5 * time.Second}
	g := &gatedBeat{lease: 30 * time.Second, entered: make(chan struct{}), open: make(chan struct{})}
	n1 := wrappedNode(t, srv, "relong3", cfg, func(s fairqueue.Store) fairqueue.Store { g.Store = s; return g })
	n2 := newNode(t, srv, "relong3", cfg)
	p, err := n2.q.Acquire(context.Background(), fairqueue.Request{})
	require.NoError(t, err)
	wCh, _ := queueWaiter(t, n1, "relong3")
	alive(t, n1)
	cfg.Lease = 30 * time.Second // a reload of n1 lengthens the lease
	require.NoError(t, n1.q.Reconfigure(cfg))
	<-g.entered // its heartbeat: snapshot taken (W waiting), on its way
	p.Release() // n2's release grants W with the lease Redis has for n1
	time.Sleep(50 * time.Millisecond)
	close(g.open) // the heartbeat lands
	w := <-wCh
	require.NoError(t, w.err)
	defer w.p.Release()
	time.Sleep(100 * time.Millisecond)
	t.Logf("W's holder entry ends in %s", holderExpiry(t, n1.rdb, "relong3", w.p.Ticket()))

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	start := time.Now()
	p2, err := n2.q.Acquire(ctx, fairqueue.Request{})
	if err == nil {
		p2.Release()
		t.Fatalf("a second request ran beside W with 1 permit (granted after %s)", time.Since(start).Round(time.Millisecond))
	}
	require.ErrorIs(t, err, context.DeadlineExceeded)
}
