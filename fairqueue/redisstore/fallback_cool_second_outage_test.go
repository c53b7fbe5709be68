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
// refuses it (Requeue with a cooldown of a minute), and cools in the
// fallback queue. Redis comes back for a few seconds, then goes away
// again, well within the cooldown: the fallback queue of the second
// outage leaves that upstream out of dispatch too. It was granted again
// at once on the upstream that had refused it (the cooldown was kept by
// the first outage's fallback queue only): the request waits instead for
// the other upstream, and is served there.
func TestLocalFallbackOfASecondOutageKeepsTheCooldownOfTheFirst(t *testing.T) {
	srv := redistest.Start(t)
	cfg := fairqueue.Config{Upstreams: []fairqueue.Upstream{{Dial: "10.0.0.1:8000", Permits: 1}, {Dial: "10.0.0.2:8000", Permits: 1}},
		Fallback: memstore.New(), Lease: 30 * time.Second, PollInterval: 50 * time.Millisecond, MaxWait: 10 * time.Second}
	nd := newNode(t, srv, "fbcoolsecond", cfg)
	var running []*fairqueue.Permit
	for range 2 {
		p, err := nd.q.Acquire(context.Background(), fairqueue.Request{})
		require.NoError(t, err)
		running = append(running, p)
	}
	refused, other := running[0].Upstream(), running[1].Upstream()
	require.NotEqual(t, refused, other, "Redis granted one request on each upstream")

	// The first outage: the request on refused is refused, with the other
	// upstream free; it runs there.
	srv.Kill()
	waitDown(t, nd)
	running[1].Release()
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Second)
	defer cancel()
	p, err := running[0].Requeue(ctx, time.Minute)
	require.NoError(t, err)
	require.True(t, p.Local(), "the requeued request waited again in the fallback queue")
	require.Equal(t, other, p.Upstream(), "the requeued request ran on the upstream that did not refuse it")
	p.Release()

	// Redis is back: the fallback queue retires, and Redis grants again.
	// One request runs on the other upstream into the second outage.
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

	// The second outage, within the cooldown.
	srv.Kill()
	waitDown(t, nd)
	type result struct {
		p   *fairqueue.Permit
		err error
	}
	got := make(chan result, 1)
	queued := make(chan struct{}, 1)
	go func() {
		p, err := nd.q.Acquire(context.Background(), fairqueue.Request{OnQueued: func(fairqueue.Waiting) {
			select {
			case queued <- struct{}{}:
			default:
			}
		}})
		got <- result{p, err}
	}()
	select {
	case <-queued: // waits: refused cools, the other upstream runs a request
	case r := <-got:
		if r.p != nil {
			defer r.p.Release()
		}
		t.Fatalf("the second outage's request was answered at once: upstream %q (refused %q a few seconds before, cooling for a minute), err %v",
			upstreamOf(r.p), refused, r.err)
	case <-time.After(8 * time.Second):
		t.Fatal("the second outage's request never queued in the fallback queue")
	}
	busy.Release()
	r := <-got
	require.NoError(t, r.err)
	assert.True(t, r.p.Local())
	assert.Equal(t, other, r.p.Upstream(), "served on the upstream that did not refuse it")
	r.p.Release()
}
