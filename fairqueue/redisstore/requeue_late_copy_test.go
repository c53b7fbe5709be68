package redisstore_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
	"github.com/fair-queue/caddy-fair-queue/fairqueue/redisstore"
	"github.com/fair-queue/caddy-fair-queue/internal/redistest"
)

// keepRequeue keeps the last Requeue call of the store it wraps.
type keepRequeue struct {
	fairqueue.Store
	mu   sync.Mutex
	last fairqueue.RequeueArgs
}

func (k *keepRequeue) Requeue(ctx context.Context, t fairqueue.RequeueArgs) (fairqueue.AcquireResult, error) {
	k.mu.Lock()
	k.last = t
	k.mu.Unlock()
	return k.Store.Requeue(ctx, t)
}

func (k *keepRequeue) Transfer(ctx context.Context, t fairqueue.TicketArgs, to string) error {
	return k.Store.(fairqueue.Transferrer).Transfer(ctx, t, to)
}

// A requeue (an upstream refused the request) sent twice, its first
// send's reply lost (go-redis sends a command again after a read
// timeout, on another connection), where the copy reaches Redis last:
// after the new ticket it queued was granted, ran and was released.
// The copy finds neither ticket; it must not queue the new ticket
// again, for a request no node waits for (its reply is read by nobody):
// that waiter would count in the queue's length (status, max_queue)
// until its turn, and, granted where a permit is free, hold that permit
// for nobody until its lease ends (its grant came back in the lost
// reply: no message tells its node), while other nodes' waiters wait
// past their max_wait.
func TestARequeueSentAgainAfterItsTicketEndedQueuesNothing(t *testing.T) {
	for _, fair := range []bool{false, true} {
		for _, free := range []bool{false, true} {
			t.Run(fmt.Sprintf("fair=%v/permit_free=%v", fair, free), func(t *testing.T) {
				lateRequeueCopy(t, fair, free)
			})
		}
	}
}

// lateRequeueCopy runs one case of
// TestARequeueSentAgainAfterItsTicketEndedQueuesNothing: the late copy
// finds a permit free, or none.
func lateRequeueCopy(t *testing.T, fair, free bool) {
	srv := redistest.Start(t)
	ctx := context.Background()
	const name = "requeue-late-copy"
	const lease = 9 * time.Second
	cfg := fairqueue.Config{Permits: 2, Fair: fair, MaxWait: 10 * time.Second, Lease: lease, PollInterval: 100 * time.Millisecond}
	k := &keepRequeue{}
	a := wrappedNode(t, srv, name, cfg, func(s fairqueue.Store) fairqueue.Store { k.Store = s; return k })
	req := fairqueue.Request{Tenant: "t1"}

	held, err := a.q.Acquire(ctx, req)
	require.NoError(t, err)
	p, err := a.q.Acquire(ctx, req)
	require.NoError(t, err)
	p2, err := p.Requeue(ctx, -1) // granted again at once: its own permit is free
	require.NoError(t, err)
	p2.Release()
	k.mu.Lock()
	late := k.last
	k.mu.Unlock()
	require.Equal(t, p2.Ticket(), late.ID)
	eventually(t, 5*time.Second, func() bool { return len(readState(t, a.rdb, name).Holders) == 1 }, "p2 not released")

	raw := redisstore.New(srv.Client(t), name, redisstore.Options{}) // opened by nobody: its reply is read by nobody
	if !free {
		// Both permits held: the late copy finds none free.
		busy, err := a.q.Acquire(ctx, req)
		require.NoError(t, err)
		_, err = raw.Requeue(ctx, late)
		require.NoError(t, err)
		st := readState(t, a.rdb, name)
		assert.Empty(t, st.Waiting, "waiters after the late copy (%s is the ticket that ended)", late.ID)
		assert.ElementsMatch(t, []string{held.Ticket(), busy.Ticket()}, st.Holders, "holders")
		busy.Release()
	} else {
		_, err = raw.Requeue(ctx, late)
		require.NoError(t, err)
		assert.Equal(t, []string{held.Ticket()}, readState(t, a.rdb, name).Holders,
			"holders after the late copy (%s is the ticket that ended)", late.ID)
	}
	// Another node's waiter gets the free permit within its max_wait,
	// well within the lease.
	b := newNode(t, srv, name, fairqueue.Config{Permits: 2, Fair: fair, MaxWait: 3 * time.Second, Lease: lease, PollInterval: 100 * time.Millisecond})
	start := time.Now()
	pb, err := b.q.Acquire(ctx, req)
	if err != nil {
		t.Fatalf("node b's waiter was not served within its max_wait (%v): %v; state: %+v (%s is the ticket that ended; lease %v)",
			time.Since(start).Round(time.Millisecond), err, readState(t, b.rdb, name), late.ID, lease)
	}
	pb.Release()
	held.Release()
	eventually(t, 5*time.Second, func() bool {
		st := readState(t, a.rdb, name)
		return len(st.Holders) == 0 && len(st.Waiting) == 0
	}, "left held or waiting: %+v", readState(t, a.rdb, name))
}
