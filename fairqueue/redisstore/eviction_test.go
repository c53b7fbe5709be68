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

// Redis under maxmemory with an allkeys-* eviction policy deletes whole
// keys, with no error and no disconnect: the queue's waiting list can go
// while the epoch, the nodes and the holders stay. The nodes must still
// find their waiters gone and queue them again, or each waits out its
// whole max_wait while the permits it waits for are free, served to
// the requests that came after. Evicted here with DEL, which is what an
// eviction does to the key; a request of the same node queued after the
// eviction makes the key again.
func TestWaitersEvictedByRedisAreQueuedAgain(t *testing.T) {
	for _, tc := range []struct {
		name string
		fair bool
		keys []string
	}{
		{"fifo", false, []string{"waiting"}},
		{"fair", true, []string{"fwait", "fticket"}},
		// The fair waiters' order only: their ticket index says they wait.
		{"fair order only", true, []string{"fwait"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := redistest.Start(t)
			cfg := fairqueue.Config{Permits: 1, Lease: 1500 * time.Millisecond, PollInterval: 50 * time.Millisecond,
				MaxWait: 30 * time.Second, Fair: tc.fair}
			a := newNode(t, srv, "evicted", cfg)
			b := newNode(t, srv, "evicted", cfg)
			p, err := a.q.Acquire(context.Background(), fairqueue.Request{})
			require.NoError(t, err)
			waiter := acquireAsync(b, context.Background())
			eventually(t, 5*time.Second, func() bool { return len(readState(t, a.rdb, "evicted").Waiting) == 1 }, "not queued")
			// Some heartbeats of both nodes pass with the waiter queued: no
			// doubt is left from its acquire.
			time.Sleep(cfg.Lease)

			tag := redisstore.New(a.rdb, "evicted", redisstore.Options{}).Tag()
			for _, k := range tc.keys {
				require.NoError(t, a.rdb.Del(context.Background(), tag+":"+k).Err())
			}
			before := len(readState(t, a.rdb, "evicted").Waiting)
			newcomer := acquireAsync(b, context.Background())
			eventually(t, 5*time.Second, func() bool { return len(readState(t, a.rdb, "evicted").Waiting) == before+1 },
				"the newcomer not queued")
			released := time.Now()
			p.Release()

			for served := 0; served < 2; served++ {
				select {
				case r := <-waiter:
					require.NoError(t, r.err)
					t.Logf("the evicted waiter was served %s after the permit was freed (lease 1.5s)", r.at.Sub(released))
					r.p.Release()
					waiter = nil
				case r := <-newcomer:
					require.NoError(t, r.err)
					r.p.Release()
					newcomer = nil
				case <-time.After(10 * time.Second):
					t.Fatalf("the waiter Redis evicted (served: %v) or the newcomer (served: %v) was not served within 10s "+
						"of the permit being freed (max_wait 30s)", waiter == nil, newcomer == nil)
				}
			}
			st := readState(t, a.rdb, "evicted")
			assert.Empty(t, st.Waiting)
			assert.Empty(t, st.Holders)
		})
	}
}

// A fair waiter whose ticket index (K.fticket) Redis evicted still
// waits in its flow's order (K.fwait), and dispatch grants it from
// there. The heartbeat that names it must not report it missing: its
// node would queue it again (reinstate), and the flow's order would hold
// it twice; the second entry is granted once the request has ended, to
// nobody (its node releases the grant at once), and charged to the flow
// again. The heartbeat names the node's oldest waiter only; the others'
// index entries come back with it, so that they count in the queue's
// length (max_queue, positions) and a cancel finds them.
func TestAFairWaiterWhoseIndexWasEvictedIsGrantedOnce(t *testing.T) {
	rdb, s := openStore(t, "indexevicted")
	ctx := context.Background()
	l := fairqueue.Limits{Permits: 1, Lease: 10 * time.Second}
	holder := fairqueue.TicketArgs{ID: "n1:1:a.0", Node: "n1", Limits: l, Cost: 1}
	r := acquireGranted(t, s, holder)
	w1 := fairqueue.TicketArgs{ID: "n1:2:b.0", Node: "n1", Limits: l, Cost: 1}
	w2 := fairqueue.TicketArgs{ID: "n1:3:c.0", Node: "n1", Limits: l, Cost: 1}
	for _, w := range []fairqueue.TicketArgs{w1, w2} {
		q, err := s.Acquire(ctx, w)
		require.NoError(t, err)
		require.False(t, q.Granted, "no permit free")
	}
	require.NoError(t, rdb.Del(ctx, s.Tag()+":fticket").Err()) // evicted

	// The node's heartbeat names its oldest waiter; one found missing is
	// queued again, and the next heartbeat names every waiter (verify).
	pending := []string{w1.ID}
	for beat := uint64(1); beat <= 2; beat++ {
		hb, err := s.Heartbeat(ctx, fairqueue.HeartbeatArgs{Node: "n1", Limits: l, Epoch: r.Epoch, Beat: beat,
			Held: []string{holder.ID}, Pending: pending})
		require.NoError(t, err)
		for _, id := range hb.Missing {
			_, err := s.Acquire(ctx, fairqueue.TicketArgs{ID: id, Node: "n1", Limits: l, Cost: 1})
			require.NoError(t, err)
		}
		if len(hb.Missing) > 0 {
			pending = []string{w1.ID, w2.ID}
		}
	}
	snap, err := s.Inspect(ctx, 0, 0)
	require.NoError(t, err)
	assert.Equal(t, 2, snap.Waiting, "the waiters counted in the queue's length")

	require.NoError(t, s.Release(ctx, holder))
	for _, w := range []fairqueue.TicketArgs{w1, w2} {
		snap, err := s.Inspect(ctx, 0, 0)
		require.NoError(t, err)
		require.Len(t, snap.Holders, 1)
		require.Equal(t, w.ID, snap.Holders[0].Ticket, "granted in arrival order")
		require.NoError(t, s.Release(ctx, w))
	}
	snap, err = s.Inspect(ctx, 0, 0)
	require.NoError(t, err)
	assert.Empty(t, snap.Holders, "a permit held for nobody: a waiter granted again after its request ended")
	assert.EqualValues(t, 3, snap.Grants, "grants made (each charged to its flow)")
	assert.Zero(t, snap.Waiting)
	assert.Zero(t, rdb.Exists(ctx, s.Tag()+":fwait").Val(), "tickets left in their flows' order")
}
