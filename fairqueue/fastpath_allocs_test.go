package fairqueue_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
	"github.com/fair-queue/caddy-fair-queue/fairqueue/memstore"
)

// fastPathAllocs is what a request granted at once and released costs
// the Queue in heap allocations, the store's (an in-process one here)
// included: the count before a waiter's live place (for its keepalive)
// was recorded, which a request that never waits has no use for.
const fastPathAllocs = 15

// A request granted at once does no more work than it did before
// waiters' places were recorded: the fast path allocates nothing for a
// place it never shows.
func TestARequestGrantedAtOnceAllocatesNoPlace(t *testing.T) {
	q, err := fairqueue.New(memstore.New(), fairqueue.Config{Name: "fastpath", Permits: 1, MaxWait: time.Second})
	require.NoError(t, err)
	t.Cleanup(func() { _ = q.Close() })
	ctx := context.Background()
	for range 10 { // the node joined, its maps grown
		p, err := q.Acquire(ctx, fairqueue.Request{})
		require.NoError(t, err)
		p.Release()
	}
	n := testing.AllocsPerRun(200, func() {
		p, err := q.Acquire(ctx, fairqueue.Request{})
		if err != nil {
			panic(err)
		}
		p.Release()
	})
	assert.LessOrEqual(t, n, float64(fastPathAllocs), "allocations of an acquire granted at once and its release")
}
