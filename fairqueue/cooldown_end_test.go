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

// The in-process store: a permit given back with a cooldown is handed
// on to the waiter as the cooldown ends, not at the next poll (20 s
// here); a request requeued on its cooling upstream runs again then too.
// (The Redis store's: fairqueue/redisstore/cooldown_end_test.go.)
func TestTheLocalStoreHandsOnAsTheCooldownEnds(t *testing.T) {
	t.Parallel()
	const cool = 300 * time.Millisecond
	cfg := fairqueue.Config{Permits: 1, MaxWait: 40 * time.Second, PollInterval: 20 * time.Second,
		Lease: time.Minute, Upstreams: []fairqueue.Upstream{{Dial: "a:1", Permits: 1}}}
	for _, requeue := range []bool{false, true} {
		store := memstore.New()
		q, err := fairqueue.New(store, cfg)
		require.NoError(t, err)
		held, err := q.Acquire(context.Background(), fairqueue.Request{})
		require.NoError(t, err)
		got := make(chan *fairqueue.Permit, 1)
		served := func(p *fairqueue.Permit, err error) {
			assert.NoError(t, err)
			got <- p
		}
		cooled := time.Now()
		if requeue {
			go func() { served(held.Requeue(context.Background(), cool)) }()
		} else {
			go func() { served(q.Acquire(context.Background(), fairqueue.Request{})) }()
			require.Eventually(t, func() bool { return len(store.State().Waiting) == 1 }, 5*time.Second, time.Millisecond)
			cooled = time.Now()
			held.Cool(cool)
			held.Release()
		}
		select {
		case p := <-got:
			require.NotNil(t, p, "requeue %v", requeue)
			require.GreaterOrEqual(t, time.Since(cooled), cool, "requeue %v: granted while its upstream cooled", requeue)
			p.Release()
		case <-time.After(10 * time.Second):
			t.Fatalf("requeue %v: still waiting 10 s after a cooldown of %s (the poll is every %s)", requeue, cool, cfg.PollInterval)
		}
		require.NoError(t, q.Close())
	}
}
