package redisstore_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
	"github.com/fair-queue/caddy-fair-queue/fairqueue/redisstore"
	"github.com/fair-queue/caddy-fair-queue/internal/redistest"
)

// loseWrites fails the Sentinel deployment over so that the promoted
// replica misses what writes does: the replica is frozen and cut from its
// master (which writes then no longer reach), writes runs on the master,
// the master is killed, and the replica thawed as the Sentinels promote it
// (its link was down for well under down-after-milliseconds). It returns
// the old master, dead.
func loseWrites(t *testing.T, s *redistest.Sentinel, writes func()) *redistest.Server {
	t.Helper()
	ctx := context.Background()
	addr := s.MasterAddr()
	var master, replica *redistest.Server
	for _, srv := range s.Servers() {
		if srv.Addr() == addr {
			master = srv
		} else {
			replica = srv
		}
	}
	require.NotNil(t, master)
	mc := master.Client(t)
	// Everything before writes is on the replica.
	require.Equal(t, int64(1), mc.Do(ctx, "WAIT", 1, 5000).Val(), "the replica caught up")
	replica.Freeze()
	require.NoError(t, mc.Do(ctx, "CLIENT", "KILL", "TYPE", "replica").Err())
	writes()
	thawed := make(chan struct{})
	go func() {
		defer close(thawed)
		time.Sleep(200 * time.Millisecond) // KillMaster has killed the master
		replica.Thaw()
	}()
	t.Logf("failed over to %s", s.KillMaster())
	<-thawed
	return master
}

// running counts the permits the test's clients hold, and the most at once.
type running struct {
	now, most atomic.Int64
}

func (r *running) start() int64 {
	n := r.now.Add(1)
	for {
		m := r.most.Load()
		if n <= m || r.most.CompareAndSwap(m, n) {
			return n
		}
	}
}

func (r *running) end() { r.now.Add(-1) }

// A Sentinel failover that loses a handoff (the release of the permit and
// its grant to another node's waiter, already started) keeps its promises
// once the nodes found the new master: the permit released is not held
// for nobody until its lease ends (the waiters behind would wait out
// their max_wait with the upstream idle), every waiter of the backlog is
// served in order, never more than the permits at once, and Redis is
// left clean. Once: between two rounds, the Sentinels on a loaded
// machine may fail back to the old master as it restarts empty (a data
// loss of its own, with its documented windows), so the second round's
// start is not the test's to set (the Cluster test runs two).
func TestSentinelFailoverLosingAHandoffServesTheBacklog(t *testing.T) {
	s := redistest.StartSentinel(t)
	var qs []*fairqueue.Queue
	for range 3 {
		qs = append(qs, openQueue(t, s.FailoverClient(t, failoverOpts), lostName, lostCfg))
	}
	admin := s.FailoverClient(t)
	lostHandoffBacklog(t, qs, admin, 1, func(round int, writes func()) {
		dead := loseWrites(t, s, writes)
		var master *redistest.Server
		for _, srv := range s.Servers() {
			if srv != dead {
				master = srv
			}
		}
		// Every node's grant channel moves to the new master.
		mc := master.Client(t)
		eventually(t, 10*time.Second, func() bool {
			// Sharded where Redis has it (7.0 on): SSUBSCRIBE.
			chs, _ := mc.PubSubShardChannels(context.Background(), lostTagOf(t)+":node:*").Result()
			plain, _ := mc.PubSubChannels(context.Background(), lostTagOf(t)+":node:*").Result()
			return len(chs)+len(plain) == len(qs)
		}, "round %d: the nodes' grant channels are not all subscribed on the new master", round)
	})
}

const lostName = "lost-writes"

// lostCfg has one permit, and a lease (the default) longer than the
// waiters' max_wait: a permit held until its lease ends keeps every
// waiter out until it times out.
var lostCfg = fairqueue.Config{Permits: 1, MaxWait: 20 * time.Second, PollInterval: 100 * time.Millisecond, Lease: 30 * time.Second}

// lostHandoffBacklog runs rounds rounds: qs[0] holds the permit while qs[1]
// and qs[2] queue a backlog, then failover(round, writes) fails Redis
// over so that it loses what writes does: qs[0] releases the permit and
// the first waiter starts on it. Every waiter must then be served in
// order before its max_wait, one at a time, and Redis be left clean once
// every node closed.
func lostHandoffBacklog(t *testing.T, qs []*fairqueue.Queue, admin redis.UniversalClient, rounds int, failover func(round int, writes func())) {
	t.Helper()
	const name, permits = lostName, 1
	cfg := lostCfg
	ctx := context.Background()
	var run running
	var over atomic.Int64 // unix ns the last failover ended
	for round := range rounds {
		// qs[0] holds the permit; qs[1] and qs[2] queue a backlog.
		held, err := qs[0].Acquire(ctx, fairqueue.Request{})
		require.NoError(t, err)
		type result struct {
			i   int
			p   *fairqueue.Permit
			err error
		}
		const backlog = 6
		results := make(chan result, backlog)
		var wg sync.WaitGroup
		for i := range backlog {
			before := i
			eventually(t, 10*time.Second, func() bool {
				w, _ := universalState(t, admin, name)
				return len(w) == before
			}, "round %d: waiter %d never queued", round, i-1)
			wg.Add(1)
			go func() {
				defer wg.Done()
				wctx, cancel := context.WithTimeout(ctx, cfg.MaxWait)
				defer cancel()
				p, err := qs[1+i%2].Acquire(wctx, fairqueue.Request{})
				if err == nil {
					if n := run.start(); n > permits {
						t.Logf("round %d: waiter %d started %v after the failover, %d running", round, i, time.Since(time.Unix(0, over.Load())), n)
					}
				}
				results <- result{i, p, err}
			}()
		}
		eventually(t, 10*time.Second, func() bool {
			w, _ := universalState(t, admin, name)
			return len(w) == backlog
		}, "round %d: the backlog never queued", round)
		run.now.Add(1) // qs[0]'s
		run.most.Store(run.now.Load())

		var first result
		failover(round, func() {
			run.end()
			held.Release() // the handoff Redis loses
			first = <-results
			require.NoError(t, first.err, "round %d: the first waiter", round)
			require.Equal(t, 0, first.i, "round %d: the first waiter served", round)
		})
		over.Store(time.Now().UnixNano())
		if w, h, err := peek(admin, name); err == nil {
			t.Logf("round %d: after the failover %d waiting, holders %v", round, len(w), h)
		}
		// The first waiter's request ends, and each waiter served holds
		// its permit a moment, as a request would.
		time.Sleep(50 * time.Millisecond)
		run.end()
		first.p.Release()
		began := time.Now()
		served := []int{0}
		for range backlog - 1 {
			select {
			case r := <-results:
				require.NoError(t, r.err, "round %d: waiter %d after %v", round, r.i, time.Since(began))
				served = append(served, r.i)
				time.Sleep(50 * time.Millisecond)
				run.end()
				r.p.Release()
			case <-time.After(cfg.MaxWait + 10*time.Second): // Acquire ends at max_wait
				t.Fatalf("round %d: served %v, the others still wait %v after the failover", round, served, time.Since(began))
			}
		}
		wg.Wait()
		t.Logf("round %d: served %v, at most %d at once", round, served, run.most.Load())
		assert.LessOrEqual(t, run.most.Load(), int64(permits), "round %d: permits in flight", round)
		assert.Equal(t, []int{0, 1, 2, 3, 4, 5}, served, "round %d: served in order", round)
	}
	for _, q := range qs {
		require.NoError(t, q.Close())
	}
	assert.Empty(t, allKeys(t, admin), "keys left after every node left")
}

// lostTagOf is the hash tag of the queue lostHandoffBacklog runs.
func lostTagOf(t *testing.T) string {
	t.Helper()
	return redisstore.New(nil, lostName, redisstore.Options{}).Tag()
}

// peek reads the queue's waiting and holding tickets, or the error of a
// client that may still route to a dead master.
func peek(rdb redis.UniversalClient, name string) (waiting, holders []string, err error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	tag := redisstore.New(rdb, name, redisstore.Options{}).Tag()
	if waiting, err = rdb.ZRange(ctx, tag+":waiting", 0, -1).Result(); err != nil {
		return nil, nil, err
	}
	holders, err = rdb.ZRange(ctx, tag+":holders", 0, -1).Result()
	return waiting, holders, err
}

// allKeys lists every key, on every master of a cluster.
func allKeys(t *testing.T, rdb redis.UniversalClient) []string {
	t.Helper()
	ctx := context.Background()
	var mu sync.Mutex
	var keys []string
	scan := func(ctx context.Context, c *redis.Client) error {
		k, err := c.Keys(ctx, "*").Result()
		mu.Lock()
		keys = append(keys, k...)
		mu.Unlock()
		return err
	}
	if cc, ok := rdb.(*redis.ClusterClient); ok {
		require.NoError(t, cc.ForEachMaster(ctx, scan))
	} else {
		require.NoError(t, scan(ctx, rdb.(*redis.Client)))
	}
	return keys
}
