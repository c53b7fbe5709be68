package redisstore_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
	"github.com/fair-queue/caddy-fair-queue/internal/redistest"
)

// coolEndCfg: a pool of one upstream of one permit, polled rarely (the
// tick and the heartbeats 20 s apart), so that only the end of a
// cooldown can hand its permit on soon.
var coolEndCfg = fairqueue.Config{Permits: 1, MaxWait: 40 * time.Second, PollInterval: 20 * time.Second,
	Lease: time.Minute, Upstreams: []fairqueue.Upstream{{Dial: "a:1", Permits: 1}}}

// coolEnd is the cooldown of these tests: short against the poll.
const coolEnd = 300 * time.Millisecond

// servedSoonAfter requires the acquire on ch granted on the pool's
// upstream within 10 s of the cooldown's start (the poll is 20 s): the
// permit freed while its upstream cooled is handed on as the cooldown
// ends, not at the next poll.
func servedSoonAfter(t *testing.T, ch <-chan acquired, cooled time.Time, what string) {
	t.Helper()
	select {
	case r := <-ch:
		require.NoError(t, r.err, what)
		require.Equal(t, "a:1", r.p.Upstream(), what)
		require.GreaterOrEqual(t, r.at.Sub(cooled), coolEnd, "%s: granted while its upstream cooled", what)
		r.p.Release()
	case <-time.After(10 * time.Second):
		t.Fatalf("%s: still waiting 10 s after a cooldown of %s (the poll is every %s)", what, coolEnd, coolEndCfg.PollInterval)
	}
}

// coolScene starts two nodes of queue name under coolEndCfg.
func coolScene(t *testing.T, name string) *rollbackScene {
	srv := redistest.Start(t)
	return sceneOf(t, srv, name, coolEndCfg, newNode(t, srv, name, coolEndCfg), newNode(t, srv, name, coolEndCfg))
}

// A permit given back with a cooldown (its upstream failed the request)
// is handed on as the cooldown ends, to a waiter of any instance: not at
// the next poll of the waiter's instance, up to poll_interval later.
func TestAPermitFreedWhileItsUpstreamCoolsIsHandedOnAsTheCooldownEnds(t *testing.T) {
	for _, tc := range []struct {
		name  string
		other bool // the waiter is another instance's
	}{{"a waiter of another instance", true}, {"a waiter of the same instance", false}} {
		t.Run(tc.name, func(t *testing.T) {
			s := coolScene(t, "cool-end")
			held, err := s.a.q.Acquire(s.ctx, fairqueue.Request{})
			require.NoError(t, err)
			waiter := s.a
			if tc.other {
				waiter = s.b
			}
			ch := acquireAsync(waiter, s.ctx)
			eventually(t, 5*time.Second, func() bool { return len(s.state(t).Waiting) == 1 }, "the waiter is not queued")
			cooled := time.Now()
			held.Cool(coolEnd)
			held.Release()
			servedSoonAfter(t, ch, cooled, "the waiter")
			s.leave(t)
		})
	}
}

// A request requeued with a cooldown (its upstream answered 503 or 429
// before anything reached the client) runs again as the cooldown ends.
func TestARequestRequeuedOnItsCoolingUpstreamRunsAsTheCooldownEnds(t *testing.T) {
	s := coolScene(t, "cool-end-requeue")
	held, err := s.a.q.Acquire(s.ctx, fairqueue.Request{})
	require.NoError(t, err)
	cooled := time.Now()
	ch := make(chan acquired, 1)
	go func() {
		p, err := held.Requeue(context.Background(), coolEnd)
		ch <- acquired{p, err, time.Now()}
	}()
	servedSoonAfter(t, ch, cooled, "the requeued request")
	s.leave(t)
}
