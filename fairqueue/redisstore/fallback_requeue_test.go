package redisstore_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
)

// A request Redis granted, running when Redis goes away, whose upstream
// refuses it (a pool's 429 or 503: Requeue) waits again as on_store_error
// local says, in the fallback queue, not refused as store_unavailable:
// with `permits 2` and nothing else running it gets a local permit.
func TestLocalFallbackTakesTheRequeueOfARequestRunningAtTheOutage(t *testing.T) {
	nd, running := runningAtTheOutage(t, "fbrunningrequeue", fairqueue.Config{Permits: 2}, fairqueue.Request{})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	p, err := running[0].Requeue(ctx, -1)
	require.NoError(t, err, "the requeue of a request Redis granted, during the outage")
	assert.True(t, p.Local(), "waited again in the fallback queue")
	if q := tryAcquire(t, nd, fairqueue.Request{}, 5*time.Second); q != nil {
		q.Release()
	} else {
		t.Error("the second permit was not given beside the requeued request")
	}
	p.Release()
}

// A pool, a request Redis granted on one upstream, running at the
// outage, whose upstream refuses it (Requeue with a cooldown): the
// fallback queue leaves that upstream out of dispatch for the cooldown,
// as Redis would have, and a local permit's requeue does. It was granted
// again at once on the upstream that had just refused it (the cooldown
// went only to Redis, down), to be refused again, up to max_requeues:
// the request waits instead for the other upstream, and is served there.
func TestLocalFallbackCoolsTheUpstreamOfARequeuedRequestRunningAtTheOutage(t *testing.T) {
	queued := make(chan struct{}, 1)
	first := fairqueue.Request{OnQueued: func(fairqueue.Waiting) {
		select {
		case queued <- struct{}{}:
		default:
		}
	}}
	_, running := runningAtTheOutage(t, "fbrequeuecool", fairqueue.Config{Upstreams: []fairqueue.Upstream{
		{Dial: "10.0.0.1:8000", Permits: 1}, {Dial: "10.0.0.2:8000", Permits: 1}}}, first, fairqueue.Request{})
	refused, other := running[0].Upstream(), running[1].Upstream()
	require.NotEqual(t, refused, other, "Redis granted one request on each upstream")

	type result struct {
		p   *fairqueue.Permit
		err error
	}
	requeued := make(chan result, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 8*time.Second)
		defer cancel()
		p, err := running[0].Requeue(ctx, 30*time.Second)
		requeued <- result{p, err}
	}()
	select {
	case <-queued: // waits in the fallback queue: the other upstream is busy
	case r := <-requeued:
		if r.p != nil {
			defer r.p.Release()
		}
		t.Fatalf("the requeued request was answered while its upstream cools and the other runs a request: upstream %q (refused %q), err %v",
			upstreamOf(r.p), refused, r.err)
	case <-time.After(8 * time.Second):
		t.Fatal("the requeued request never queued in the fallback queue")
	}
	running[1].Release()
	r := <-requeued
	require.NoError(t, r.err)
	assert.True(t, r.p.Local())
	assert.Equal(t, other, r.p.Upstream(), "served on the upstream that did not refuse it")
	r.p.Release()
}

func upstreamOf(p *fairqueue.Permit) string {
	if p == nil {
		return ""
	}
	return p.Upstream()
}
