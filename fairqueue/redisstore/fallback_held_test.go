package redisstore_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
	"github.com/fair-queue/caddy-fair-queue/internal/redistest"
)

// heldAtTheOutage opens n instances of one queue with on_store_error
// local, has the first take held permits from Redis (grants uneven: it
// holds more than its part), each weighing weight tokens, lets every instance see them and the n live
// instances in a heartbeat, then kills Redis: the held requests run on
// through the outage.
func heldAtTheOutage(t *testing.T, name string, n, held, weight int, cfg fairqueue.Config) ([]*node, []*fairqueue.Permit) {
	t.Helper()
	srv := redistest.Start(t)
	nodes := joinOutageNodes(t, srv, name, n, cfg)
	var running []*fairqueue.Permit
	for range held {
		p, err := nodes[0].q.Acquire(context.Background(), fairqueue.Request{Tokens: weight})
		require.NoError(t, err)
		require.False(t, p.Local(), "granted by Redis")
		running = append(running, p)
	}
	for i, nd := range nodes {
		eventually(t, 10*time.Second, func() bool {
			c := nd.q.Stats().Cluster
			return c.Nodes == n && c.Holders == held
		}, "instance %d never saw the %d live instances and the %d permits held in a heartbeat", i, n, held)
	}
	srv.Kill()
	return nodes, running
}

// While Redis is down, the instances' fallback queues together run no
// more than the permits, counting the requests Redis granted that still
// run, whoever runs them: 5 permits over 3 instances, the first running
// 3 at the outage, the three fallback queues admit 2 more between them
// (not the 2, 2 and 1 dealt, less each one's own: 3 or 4 more), and the
// first its 3 again once its requests end.
func TestLocalFallbacksCountThePermitsEveryInstanceHeld(t *testing.T) {
	t.Parallel() // its own redis-server: it waits on it, not on the CPU
	nodes, running := heldAtTheOutage(t, "fbheld", 3, 3, 0, fairqueue.Config{Permits: 5})
	var each []int
	admitted := 0
	for _, nd := range nodes {
		got := admitAll(t, nd)
		each = append(each, len(got))
		admitted += len(got)
		for _, p := range got {
			defer p.Release()
		}
	}
	assert.Equal(t, 2, admitted, "with 3 of 5 permits running on the first instance, the 3 instances' "+
		"fallback queues admitted %v at once: %d running on an upstream of 5", each, 3+admitted)
	for _, p := range running {
		p.Release()
	}
	again := admitAll(t, nodes[0])
	for _, p := range again {
		defer p.Release()
	}
	assert.Equal(t, 3, len(again), "the first instance's 3 requests ended: it admits as many again")
}

// Likewise per upstream of a pool: one upstream of 6 permits over 3
// instances, the first running 4 on it at the outage, the fallback
// queues admit 2 more between them, one on each instance that held none
// (not 2 each less their own: 4).
func TestLocalFallbacksCountEachUpstreamsPermitsEveryInstanceHeld(t *testing.T) {
	t.Parallel() // its own redis-server: it waits on it, not on the CPU
	nodes, _ := heldAtTheOutage(t, "fbheldpool", 3, 4, 0, fairqueue.Config{
		Upstreams: []fairqueue.Upstream{{Dial: "u1:1", Permits: 6}}})
	var each []int
	admitted := 0
	for _, nd := range nodes {
		got := admitAll(t, nd)
		each = append(each, len(got))
		admitted += len(got)
		for _, p := range got {
			assert.Equal(t, "u1:1", p.Upstream())
			defer p.Release()
		}
	}
	assert.Equal(t, []int{0, 1, 1}, each, "with 4 of its 6 permits running on the first instance, the 3 instances' "+
		"fallback queues admitted %v at once on the upstream: %d running on it", each, 4+admitted)
}

// An instance that held nothing where the others held every permit (a
// saturated queue at the outage) still serves its clients while Redis is
// down, one at a time (the floor), not a timeout at max_wait for every
// one: 2 permits over 2 instances, the first running both.
func TestLocalFallbackOfAnInstanceThatHeldNoneServesOneAtATime(t *testing.T) {
	t.Parallel() // its own redis-server: it waits on it, not on the CPU
	for _, tc := range []struct {
		name           string
		weight, tokens int
		cfg            fairqueue.Config
	}{
		{"permits", 0, 0, fairqueue.Config{Permits: 2}},
		// kv_tokens alone: the first's 2 requests weigh all 100; the
		// other's share is 1 token, and a request weighs at most its
		// fallback queue's tokens.
		{"tokens", 50, 40, fairqueue.Config{KVTokens: 100}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			nodes, running := heldAtTheOutage(t, "fbheldnone"+tc.name, 2, 2, tc.weight, tc.cfg)
			for _, p := range running {
				defer p.Release()
			}
			// The first request finds Redis down, and is served.
			p, err := nodes[1].q.Acquire(context.Background(), fairqueue.Request{Tokens: tc.tokens})
			require.NoError(t, err, "the instance that held none serves none")
			require.True(t, p.Local(), "admitted by the local fallback")
			p.Release()
			// Its clients, 4 at once, are all served, one at a time.
			var now, most atomic.Int32
			errs := make(chan error, 4)
			for range 4 {
				go func() {
					p, err := nodes[1].q.Acquire(context.Background(), fairqueue.Request{Tokens: tc.tokens})
					if err == nil {
						n := now.Add(1)
						for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
						}
						time.Sleep(20 * time.Millisecond) // room for a second one to overlap
						now.Add(-1)
						p.Release()
					}
					errs <- err
				}()
			}
			for range 4 {
				assert.NoError(t, <-errs, "a client of the instance that held none")
			}
			assert.Equal(t, int32(1), most.Load(), "requests the instance that held none ran at once")
		})
	}
}
