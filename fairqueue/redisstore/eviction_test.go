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
