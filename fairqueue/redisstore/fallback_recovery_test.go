package redisstore_test

import (
	"context"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
	"github.com/fair-queue/caddy-fair-queue/fairqueue/memstore"
	"github.com/fair-queue/caddy-fair-queue/internal/redistest"
)

// Local fallback, recovery: once Redis is back and the running local
// permits are counted there (adopted), the local queue's waiters wait in
// the shared queue: a permit of the local queue would run beside the
// store's grants, unknown to Redis until the node's next heartbeat. The
// permits hold.
func TestLocalFallbackWaitersServedAfterRecoveryDoNotRunBesideTheStoresGrants(t *testing.T) {
	srv := redistest.Start(t)
	const permits = 2
	n := newNode(t, srv, "localrecover", fairqueue.Config{Permits: permits, LocalPermits: permits, Fallback: memstore.New(),
		Lease: 1500 * time.Millisecond, PollInterval: 50 * time.Millisecond, MaxWait: 10 * time.Second})
	p, err := n.q.Acquire(context.Background(), fairqueue.Request{})
	require.NoError(t, err)
	p.Release()
	srv.Kill()

	var inside, maxInside atomic.Int32
	var measure atomic.Bool
	run := func(p *fairqueue.Permit, hold time.Duration) {
		c := inside.Add(1)
		if measure.Load() {
			for m := maxInside.Load(); c > m && !maxInside.CompareAndSwap(m, c); m = maxInside.Load() {
			}
		}
		time.Sleep(hold)
		inside.Add(-1)
		p.Release()
	}
	var wg sync.WaitGroup
	var locals atomic.Int32
	var localMu sync.Mutex
	var localIDs []string // the local permits' tickets
	// 8 requests on 2 local permits, 400ms each: the local queue is busy
	// for about 1.6s, most of it after Redis is back.
	for i := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			p, err := n.q.Acquire(context.Background(), fairqueue.Request{})
			if !assert.NoError(t, err) {
				return
			}
			if p.Local() {
				locals.Add(1)
				localMu.Lock()
				localIDs = append(localIDs, p.Ticket())
				localMu.Unlock()
			}
			run(p, 400*time.Millisecond)
		}()
		if i == 0 { // the others find the store marked down
			eventually(t, 3*time.Second, func() bool { return !n.q.Stats().StoreUp }, "store never marked down")
		}
	}
	eventually(t, 2*time.Second, func() bool { return inside.Load() == permits }, "local permits not taken")
	srv.Restart()
	eventually(t, 5*time.Second, func() bool { return n.q.Stats().StoreUp }, "store never back up")
	// The running local permits are adopted by the next heartbeat: both
	// are counted in Redis before the measure starts (another holder, a
	// request whose acquire was on its way through the outage, does not
	// say they are).
	eventually(t, 3*time.Second, func() bool {
		localMu.Lock()
		defer localMu.Unlock()
		return len(localIDs) == permits && isSubset(localIDs, readState(t, n.rdb, "localrecover").Holders)
	}, "local permits never adopted")
	measure.Store(true)
	// New requests, through Redis now: 8 of them, 100ms each.
	var stores atomic.Int32
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			p, err := n.q.Acquire(context.Background(), fairqueue.Request{})
			if !assert.NoError(t, err) {
				return
			}
			if !p.Local() {
				stores.Add(1)
			}
			run(p, 100*time.Millisecond)
		}()
		time.Sleep(20 * time.Millisecond)
	}
	wg.Wait()
	t.Logf("local permits %d, shared permits %d, most running at once after the adoption %d", locals.Load(), stores.Load(), maxInside.Load())
	assert.LessOrEqual(t, maxInside.Load(), int32(permits), "more requests ran than the permits after Redis was back and the local permits were adopted")
}

// isSubset reports whether every one of ids is in of.
func isSubset(ids, of []string) bool {
	for _, id := range ids {
		if !slices.Contains(of, id) {
			return false
		}
	}
	return true
}
