package redisstore_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
)

// A request Redis granted on a pool's only upstream, running when Redis
// goes away, whose upstream refuses it (Requeue with a cooldown of
// 300 ms): it waits in the fallback queue, that upstream cooling there,
// and runs again as the cooldown ends, not at the fallback queue's next
// poll (30 s here), as a request requeued while Redis is up does.
func TestLocalFallbackHandsOnAsTheCooldownOfARequeueEnds(t *testing.T) {
	const cool = 300 * time.Millisecond
	cfg := fairqueue.Config{Lease: 2 * time.Minute, PollInterval: 30 * time.Second, MaxWait: 60 * time.Second,
		Upstreams: []fairqueue.Upstream{{Dial: "10.0.0.1:8000", Permits: 1}}}
	_, running := runningAtTheOutage(t, "fbcoolend", cfg, fairqueue.Request{})
	type result struct {
		p   *fairqueue.Permit
		err error
	}
	requeued := make(chan result, 1)
	cooled := time.Now()
	go func() {
		p, err := running[0].Requeue(context.Background(), cool)
		requeued <- result{p, err}
	}()
	select {
	case r := <-requeued:
		require.NoError(t, r.err)
		assert.True(t, r.p.Local(), "waited again in the fallback queue")
		assert.GreaterOrEqual(t, time.Since(cooled), cool, "granted again while its upstream cooled")
		r.p.Release()
	case <-time.After(10 * time.Second):
		t.Fatalf("still waiting in the fallback queue 10 s after a cooldown of %s (the poll is every %s)", cool, cfg.PollInterval)
	}
}
