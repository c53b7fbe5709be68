package redisstore_test

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
	"github.com/fair-queue/caddy-fair-queue/fairqueue/redisstore"
	"github.com/fair-queue/caddy-fair-queue/fairqueue/storetest"
	"github.com/fair-queue/caddy-fair-queue/internal/redistest"
)

// clusterOpts gives a cluster client the short timeouts and bounded
// retries of a production queue client.
func clusterOpts(o *redis.ClusterOptions) {
	o.DialTimeout = redisstore.DefaultDialTimeout
	o.ReadTimeout = redisstore.DefaultReadTimeout
	o.WriteTimeout = redisstore.DefaultWriteTimeout
	o.MaxRetries = redisstore.DefaultMaxRetries
	o.ContextTimeoutEnabled = true
}

func failoverOpts(o *redis.FailoverOptions) {
	o.DialTimeout = redisstore.DefaultDialTimeout
	o.ReadTimeout = redisstore.DefaultReadTimeout
	o.WriteTimeout = redisstore.DefaultWriteTimeout
	o.MaxRetries = redisstore.DefaultMaxRetries
	o.ContextTimeoutEnabled = true
}

// openQueue opens queue name on rdb as one node; the queue is closed
// when the test ends, the client is the caller's.
func openQueue(t testing.TB, rdb redis.UniversalClient, name string, cfg fairqueue.Config) *fairqueue.Queue {
	t.Helper()
	cfg.Name = name
	q, err := fairqueue.New(redisstore.New(rdb, name, redisstore.Options{}), cfg)
	require.NoError(t, err)
	t.Cleanup(func() { _ = q.Close() })
	return q
}

// universalState reads a queue's waiting and holding tickets through any
// client, cluster included (the keys share one hash tag: one slot).
func universalState(t testing.TB, rdb redis.UniversalClient, name string) (waiting, holders []string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	tag := redisstore.New(rdb, name, redisstore.Options{}).Tag()
	waiting, err := rdb.ZRange(ctx, tag+":waiting", 0, -1).Result()
	require.NoError(t, err)
	fair, err := rdb.HKeys(ctx, tag+":fticket").Result() // fair tickets waiting
	require.NoError(t, err)
	waiting = append(waiting, fair...)
	holders, err = rdb.ZRange(ctx, tag+":holders", 0, -1).Result()
	require.NoError(t, err)
	return waiting, holders
}

// The conformance suite on a real 3-master Redis Cluster: each node has
// its own cluster client, as each Caddy instance would; so has each
// handle of the cases that drive the Store contract directly.
func TestConformanceOnCluster(t *testing.T) {
	cluster := redistest.StartCluster(t, 3)
	admin := cluster.ClusterClient(t)
	storetest.Run(t, storetest.Harness{
		NewNode: func(t *testing.T, name string, cfg fairqueue.Config) *fairqueue.Queue {
			return openQueue(t, cluster.ClusterClient(t, clusterOpts), name, cfg)
		},
		Store: func(t *testing.T, name string) fairqueue.Store {
			return redisstore.New(cluster.ClusterClient(t, clusterOpts), name, redisstore.Options{})
		},
		State: func(t *testing.T, name string) ([]string, []string) {
			return universalState(t, admin, name)
		},
	})
	if keys := cluster.Keys(t, "*"); len(keys) > 0 {
		t.Errorf("keys left in the cluster after every node closed: %v", keys)
	}
}

// usage tracks how many permits the test's workers hold at once, as the
// upstream behind the queue would count them.
type usage struct {
	mu      sync.Mutex
	inUse   int
	max     int
	grants  int
	rejects map[fairqueue.Reason]int
}

func (u *usage) acquired() {
	u.mu.Lock()
	defer u.mu.Unlock()
	u.inUse++
	u.grants++
	u.max = max(u.max, u.inUse)
}

func (u *usage) released() {
	u.mu.Lock()
	defer u.mu.Unlock()
	u.inUse--
}

func (u *usage) rejected(r fairqueue.Reason) {
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.rejects == nil {
		u.rejects = make(map[fairqueue.Reason]int)
	}
	u.rejects[r]++
}

// phase returns the highest use and the grants since the last phase,
// and starts a new one from the use of now.
func (u *usage) phase() (maxInUse, grants int) {
	u.mu.Lock()
	defer u.mu.Unlock()
	maxInUse, grants = u.max, u.grants
	u.max, u.grants = u.inUse, 0
	return maxInUse, grants
}

// runWorkers starts n workers per queue that acquire, hold for hold and
// release, until stop is closed; wait returns when all have stopped.
func runWorkers(qs []*fairqueue.Queue, n int, hold time.Duration, u *usage, stop <-chan struct{}) (wait func()) {
	var wg sync.WaitGroup
	for i := range n * len(qs) {
		q := qs[i%len(qs)]
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				p, err := q.Acquire(context.Background(), fairqueue.Request{})
				if err != nil {
					u.rejected(fairqueue.ReasonOf(err))
					time.Sleep(20 * time.Millisecond)
					continue
				}
				u.acquired()
				time.Sleep(hold)
				u.released()
				p.Release()
			}
		})
	}
	return wg.Wait
}

// Three nodes share one queue on a 3-master Cluster under load: the
// permits are never exceeded, grants follow arrival order, grants reach
// other nodes over sharded Pub/Sub (SSUBSCRIBE on the slot of the
// queue's hash tag, never a cluster-wide SUBSCRIBE), and once the nodes
// close nothing of the queue is left on any master.
func TestClusterNodesShareOneQueueOverShardedPubSub(t *testing.T) {
	cluster := redistest.StartCluster(t, 3)
	const name, permits = "llm", 3
	cfg := fairqueue.Config{Permits: permits, MaxWait: time.Minute, PollInterval: 100 * time.Millisecond, Lease: 5 * time.Second}
	var qs []*fairqueue.Queue
	for range 3 {
		qs = append(qs, openQueue(t, cluster.ClusterClient(t, clusterOpts), name, cfg))
	}
	tag := redisstore.New(nil, name, redisstore.Options{}).Tag()

	// 90 acquires at once over the three nodes, each holding its permit
	// a few milliseconds: most wait, and most handoffs cross nodes.
	var u usage
	var mu sync.Mutex
	var held []*fairqueue.Permit
	var wg sync.WaitGroup
	subscribed := make(chan struct{})
	for i := range 90 {
		q := qs[i%3]
		wg.Go(func() {
			p, err := q.Acquire(context.Background(), fairqueue.Request{})
			if !assert.NoError(t, err) {
				return
			}
			u.acquired()
			storetest.GrantNo(t, p) // learnt while held: see GrantNo
			if i == 0 {
				<-subscribed // hold the first permit while the channels are checked
			}
			time.Sleep(time.Duration(2+i%4) * time.Millisecond)
			u.released()
			mu.Lock()
			held = append(held, p)
			mu.Unlock()
			p.Release()
		})
	}

	// Every node listens on its own shard channel, all on the master of
	// the queue's slot; nobody uses classic Pub/Sub.
	ctx := context.Background()
	var shard []string
	require.Eventually(t, func() bool {
		shard = shard[:0]
		for _, n := range cluster.Nodes() {
			chs, err := n.Client(t).PubSubShardChannels(ctx, tag+":node:*").Result()
			require.NoError(t, err)
			shard = append(shard, chs...)
		}
		return len(shard) == 3
	}, 10*time.Second, 20*time.Millisecond, "shard channels %v", shard)
	for _, q := range qs {
		assert.Contains(t, shard, tag+":node:"+q.Node())
	}
	for _, n := range cluster.Nodes() {
		classic, err := n.Client(t).PubSubChannels(ctx, "*").Result()
		require.NoError(t, err)
		assert.Empty(t, classic, "classic Pub/Sub channels on %s", n.Addr())
	}
	close(subscribed)
	wg.Wait()

	maxInUse, grants := u.phase()
	assert.Equal(t, 90, grants)
	assert.LessOrEqual(t, maxInUse, permits, "permits held at once")
	assert.Equal(t, permits, maxInUse, "the permits were used")

	// Grants in arrival order: sorted by grant number, the arrival
	// numbers increase.
	slices.SortFunc(held, func(a, b *fairqueue.Permit) int { return int(a.GrantNo() - b.GrantNo()) })
	for i, p := range held {
		require.NotZero(t, p.GrantNo(), "grant number of %s", p.Ticket())
		if i > 0 {
			require.Less(t, held[i-1].Seq(), p.Seq(), "grant %d (seq %d) after grant %d (seq %d)",
				p.GrantNo(), p.Seq(), held[i-1].GrantNo(), held[i-1].Seq())
		}
	}

	for _, q := range qs {
		require.NoError(t, q.Close())
	}
	assert.Empty(t, cluster.Keys(t, "*"), "keys left in the cluster after every node closed")
}

// Three nodes on a Sentinel-managed master keep the permits under load
// before a failover and after it. The master is killed mid-load.
//
// During the failover (detection takes the Sentinels' down-after of 1s,
// then agreement, election and promotion: 2-6s in all here) every store
// call fails: the nodes reject with store_unavailable, and requests
// already holding permits keep running. Writes the replica had not
// received when the master died are lost (asynchronous replication). A
// grant lost that way is unknown to the new master until its owner's
// next heartbeat counts it again: the upstream may see one request more
// per lost grant until then; at most twice the permits in all. A release lost the same way
// holds a permit for nobody until the owner's next reconcile frees it
// (at most the lease). On loopback the replica lags by well under a
// millisecond, so this run usually loses nothing; it checks the bound
// in the window and the permits before and after it.
func TestSentinelFailoverMidLoadKeepsPermitsBeforeAndAfter(t *testing.T) {
	s := redistest.StartSentinel(t)
	const name, permits = "llm", 3
	lease := 2 * time.Second
	cfg := fairqueue.Config{Permits: permits, MaxWait: 5 * time.Second, PollInterval: 100 * time.Millisecond, Lease: lease}
	var qs []*fairqueue.Queue
	for range 3 {
		qs = append(qs, openQueue(t, s.FailoverClient(t, failoverOpts), name, cfg))
	}
	var u usage
	stop := make(chan struct{})
	const hold = 30 * time.Millisecond
	wait := runWorkers(qs, 4, hold, &u, stop)
	defer func() {
		select {
		case <-stop:
		default:
			close(stop)
			wait()
		}
	}()

	time.Sleep(2 * time.Second)
	maxBefore, grantsBefore := u.phase()
	t.Logf("before the failover: %d grants, at most %d permits held", grantsBefore, maxBefore)
	assert.LessOrEqual(t, maxBefore, permits, "permits held at once before the failover")
	assert.Greater(t, grantsBefore, 20, "grants before the failover")

	start := time.Now()
	newMaster := s.KillMaster()
	failover := time.Since(start)
	maxOutage, grantsOutage := u.phase()

	// Back in service: a node's first successful call marks the store up
	// and its loop heartbeats at once, re-asserting its holders; give
	// that a lease third, plus the hold of requests granted meanwhile.
	require.Eventually(t, func() bool {
		u.mu.Lock()
		defer u.mu.Unlock()
		return u.grants > 0
	}, 20*time.Second, 20*time.Millisecond, "no grant after the failover")
	recovered := time.Since(start)
	time.Sleep(lease/3 + hold + 500*time.Millisecond)
	maxRecovery, grantsRecovery := u.phase()
	u.mu.Lock()
	rejects := u.rejects
	u.rejects = nil
	u.mu.Unlock()
	t.Logf("failover to %s took %v (%d grants meanwhile, at most %d permits held); first grant on the new master after %v",
		newMaster, failover.Round(time.Millisecond), grantsOutage, maxOutage, recovered.Round(time.Millisecond))
	t.Logf("recovery window: %d grants, at most %d permits held (over-admission %d); rejects so far %v",
		grantsRecovery, maxRecovery, max(maxRecovery-permits, 0), rejects)
	// Lost writes can hide at most the permits held when the master died.
	assert.LessOrEqual(t, max(maxOutage, maxRecovery), 2*permits, "over-admission beyond the bound of the failover window")

	time.Sleep(3 * time.Second)
	maxAfter, grantsAfter := u.phase()
	t.Logf("after the failover: %d grants, at most %d permits held", grantsAfter, maxAfter)
	assert.LessOrEqual(t, maxAfter, permits, "permits held at once after the failover")
	assert.Greater(t, grantsAfter, 20, "grants after the failover")

	close(stop)
	wait()
	for _, q := range qs {
		require.NoError(t, q.Close())
	}
	var master *redistest.Server
	for _, srv := range s.Servers() {
		if srv.Addr() == newMaster {
			master = srv
		}
	}
	require.NotNil(t, master)
	assert.Empty(t, master.Keys(t, "*"), "keys left on the new master after every node closed")
}
