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

// A pool, on_store_error local: a request the fallback queue admitted on
// one upstream while the instance was cut off from Redis, adopted by
// Redis once it is back, whose upstream then refuses it (a 429/503:
// Requeue with a cooldown), waits again in Redis's queue with that
// upstream cooling there, as any request Redis granted would. The
// cooldown went only to the retired fallback queue: Redis granted it
// again at once on the upstream that had just refused it, the other one
// being busy.
func TestRequeueOfAnAdoptedLocalPermitCoolsItsUpstreamInRedis(t *testing.T) {
	srv := redistest.Start(t)
	cfg := fairqueue.Config{Permits: 2, Fallback: memstore.New(), LocalPermits: 1,
		Upstreams: []fairqueue.Upstream{{Dial: "u1:1", Permits: 1}, {Dial: "u2:1", Permits: 1}},
		Lease:     30 * time.Second, PollInterval: 50 * time.Millisecond, MaxWait: 10 * time.Second}
	a, _, px := cutOffPair(t, srv, "adoptedrequeuecool", cfg, fairqueue.Request{}, fairqueue.Request{})
	ctx := context.Background()

	queued := make(chan struct{}, 1)
	px.Cut()
	p, err := a.q.Acquire(ctx, fairqueue.Request{OnQueued: func(fairqueue.Waiting) {
		select {
		case queued <- struct{}{}:
		default:
		}
	}})
	require.NoError(t, err)
	require.True(t, p.Local(), "admitted by the fallback queue")
	refused := p.Upstream()
	px.Heal()
	// Once Redis counts the local permit and the fallback queue is
	// retired, a new request is Redis's, on the other upstream.
	var other *fairqueue.Permit
	eventually(t, 15*time.Second, func() bool {
		r := tryAcquire(t, a, fairqueue.Request{}, 200*time.Millisecond)
		if r != nil && !r.Local() {
			other = r
			return true
		}
		if r != nil {
			r.Release()
		}
		return false
	}, "Redis never served the instance again")
	defer func() {
		if other != nil {
			other.Release()
		}
	}()
	require.NotEqual(t, refused, other.Upstream(), "granted beside the adopted request, on the other upstream")

	type result struct {
		p   *fairqueue.Permit
		err error
	}
	requeued := make(chan result, 1)
	go func() {
		rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		r, err := p.Requeue(rctx, 30*time.Second)
		requeued <- result{r, err}
	}()
	select {
	case <-queued: // waits: its upstream cools, the other runs a request
	case r := <-requeued:
		if r.p != nil {
			defer r.p.Release()
		}
		t.Fatalf("the requeued request was answered while its upstream cools and the other runs a request: upstream %q (refused %q), err %v",
			upstreamOf(r.p), refused, r.err)
	case <-time.After(10 * time.Second):
		t.Fatal("the requeued request never queued")
	}
	other.Release()
	other = nil
	r := <-requeued
	require.NoError(t, r.err)
	assert.False(t, r.p.Local(), "served by Redis")
	assert.NotEqual(t, refused, r.p.Upstream(), "served on the upstream that did not refuse it")
	r.p.Release()
}
