package redisstore_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
	"github.com/fair-queue/caddy-fair-queue/fairqueue/redisstore"
	"github.com/fair-queue/caddy-fair-queue/internal/redistest"
)

// failOneRelease fails, without running it, the first Release of ticket
// id: the call was lost on its way (a connection dropped, a blip).
type failOneRelease struct {
	fairqueue.Store
	mu     sync.Mutex
	id     string
	failed bool
}

func (f *failOneRelease) Release(ctx context.Context, t fairqueue.TicketArgs) error {
	f.mu.Lock()
	fail := t.ID == f.id && !f.failed
	if fail {
		f.failed = true
	}
	f.mu.Unlock()
	if fail {
		return errors.New("injected: release lost on its way")
	}
	return f.Store.Release(ctx, t)
}

func (f *failOneRelease) Transfer(ctx context.Context, t fairqueue.TicketArgs, to string) error {
	return f.Store.(fairqueue.Transferrer).Transfer(ctx, t, to)
}

// A grant message for a ticket the node no longer knows (its waiter
// left as the grant was made) is released at once. If that one release
// fails (a single failed call: the store is not marked down), the permit
// is held for nobody. A node with no waiters does not reconcile, and its
// heartbeats renew only the permits it names, so the ghost holds its
// permit for a whole lease while other nodes' waiters wait past their
// max_wait (the promise: no longer than about a poll interval). A failed
// transfer notes evSweep (reconcile for a while) for the same reason; a
// failed release of a stray grant (or of a Permit) does not.
func TestStrayGrantWhoseReleaseFailsIsNotHeldForALease(t *testing.T) {
	srv := redistest.Start(t)
	const name = "stray"
	const lease = 9 * time.Second
	cfg := fairqueue.Config{Permits: 1, MaxWait: 10 * time.Second, Lease: lease, PollInterval: 100 * time.Millisecond}
	f := &failOneRelease{}
	a := wrappedNode(t, srv, name, cfg, func(s fairqueue.Store) fairqueue.Store { f.Store = s; return f })
	ctx := context.Background()
	// Open node a (its subscription, its loop) with one acquire.
	p, err := a.q.Acquire(ctx, fairqueue.Request{})
	require.NoError(t, err)
	p.Release()
	eventually(t, 5*time.Second, func() bool { return len(readState(t, a.rdb, name).Holders) == 0 }, "not released")

	// Redis grants a ticket of node a that node a no longer knows.
	ghost := fairqueue.TicketID{Node: a.q.Node(), Counter: 1 << 40}.String()
	f.mu.Lock()
	f.id = ghost
	f.mu.Unlock()
	raw := redisstore.New(srv.Client(t), name, redisstore.Options{})
	res, err := raw.Acquire(ctx, fairqueue.TicketArgs{ID: ghost, Node: a.q.Node(), Cost: 1,
		Limits: fairqueue.Limits{Permits: 1, Lease: lease}})
	require.NoError(t, err)
	require.True(t, res.Granted)
	// Its message arrives: the node releases it, and that call fails.
	a.q.Granted(fairqueue.Grant{Ticket: ghost, No: res.GrantNo})
	eventually(t, 5*time.Second, func() bool {
		f.mu.Lock()
		defer f.mu.Unlock()
		return f.failed
	}, "the stray grant was not released")

	// Another node's waiter: the permit is free for it once node a's next
	// reconcile finds the ghost.
	b := newNode(t, srv, name, fairqueue.Config{Permits: 1, MaxWait: 3 * time.Second, Lease: lease, PollInterval: 100 * time.Millisecond})
	start := time.Now()
	pb, err := b.q.Acquire(ctx, fairqueue.Request{})
	if err != nil {
		t.Fatalf("node b's waiter was not served within its max_wait (%v): %v; holders: %v (the ghost %s holds the permit until its lease of %v ends)",
			time.Since(start).Round(time.Millisecond), err, readState(t, b.rdb, name).Holders, ghost, lease)
	}
	t.Logf("node b served after %v", time.Since(start).Round(time.Millisecond))
	pb.Release()
}
