package redisstore_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
	"github.com/fair-queue/caddy-fair-queue/fairqueue/memstore"
	"github.com/fair-queue/caddy-fair-queue/internal/redistest"
)

// A pool: during an outage, the upstream of a request Redis granted
// refuses it (Requeue with a cooldown); Redis comes back, then goes away
// again within the cooldown, the other upstream running a request: the
// fallback queue of the second outage, which keeps the cooldown, serves
// its waiter on the refused upstream as the cooldown ends, not at its
// next poll (30 s here).
func TestLocalFallbackOfASecondOutageHandsOnAsTheCooldownOfTheFirstEnds(t *testing.T) {
	t.Parallel() // its own redis-server: it waits on it, not on the CPU
	const cool = 15 * time.Second
	srv := redistest.Start(t)
	cfg := fairqueue.Config{Upstreams: []fairqueue.Upstream{{Dial: "10.0.0.1:8000", Permits: 1}, {Dial: "10.0.0.2:8000", Permits: 1}},
		Fallback: memstore.New(), Lease: 2 * time.Minute, PollInterval: 30 * time.Second, MaxWait: 60 * time.Second}
	nd := newNode(t, srv, "fbcoolendsecond", cfg)
	var running []*fairqueue.Permit
	for range 2 {
		p, err := nd.q.Acquire(context.Background(), fairqueue.Request{})
		require.NoError(t, err)
		running = append(running, p)
	}
	refused, other := running[0].Upstream(), running[1].Upstream()
	require.NotEqual(t, refused, other, "Redis granted one request on each upstream")

	// The first outage: the request is refused and waits in the fallback
	// queue (the other upstream runs a request), its upstream cooling,
	// until its client leaves.
	srv.Kill()
	waitDown(t, nd)
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	cooled := time.Now()
	_, err := running[0].Requeue(ctx, cool)
	cancel()
	require.Error(t, err, "served while its upstream cools and the other runs a request")
	running[1].Release()

	// Redis is back (found at once: a short poll meanwhile); one request
	// runs on the other upstream into the second outage.
	fast := cfg
	fast.PollInterval = 50 * time.Millisecond
	require.NoError(t, nd.q.Reconfigure(fast))
	srv.Restart()
	var busy *fairqueue.Permit
	eventually(t, 15*time.Second, func() bool {
		p := tryAcquire(t, nd, fairqueue.Request{}, 200*time.Millisecond)
		if p != nil && p.Local() {
			p.Release()
			return false
		}
		busy = p
		return p != nil
	}, "Redis never granted once back")
	if busy.Upstream() == refused {
		onRefused := busy
		busy, err = nd.q.Acquire(context.Background(), fairqueue.Request{})
		require.NoError(t, err)
		onRefused.Release()
	}
	require.Equal(t, other, busy.Upstream())
	defer busy.Release()
	require.NoError(t, nd.q.Reconfigure(cfg))

	// The second outage, within the cooldown.
	srv.Kill()
	waitDown(t, nd)
	require.Less(t, time.Since(cooled), cool-3*time.Second, "the second outage began too late into the cooldown for this test")
	got := make(chan *fairqueue.Permit, 1)
	go func() {
		p, err := nd.q.Acquire(context.Background(), fairqueue.Request{})
		assert.NoError(t, err)
		got <- p
	}()
	select {
	case p := <-got:
		require.NotNil(t, p)
		assert.True(t, p.Local())
		assert.Equal(t, refused, p.Upstream())
		assert.GreaterOrEqual(t, time.Since(cooled), cool, "served while its upstream cooled")
		p.Release()
	case <-time.After(time.Until(cooled.Add(cool + 8*time.Second))):
		t.Fatalf("still waiting in the second outage's fallback queue 8 s after the cooldown of %s ended (the poll is every %s)", cool, cfg.PollInterval)
	}
}
