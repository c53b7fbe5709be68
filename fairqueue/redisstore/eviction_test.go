package redisstore_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
	"github.com/fair-queue/caddy-fair-queue/fairqueue/redisstore"
	"github.com/fair-queue/caddy-fair-queue/internal/redistest"
)

// Redis under maxmemory with an allkeys-* eviction policy deletes whole
// keys, with no error and no disconnect: any key of the queue can go
// while the others stay. Each is evicted here (DEL, which is what an
// eviction does to the key) at the worst moment: requests of one node
// hold every permit while another node's wait, and, in the fair queue,
// with kv_tokens and a pool. What users rely on still holds:
// docs/failures.md allows more than the permits (or the tokens, or an
// upstream's permits) to run only until the next heartbeat of each node,
// which counts a lost holder again; no grant made after that runs above
// them. Every waiter, queued before the eviction or after, is served
// (none waits out its max_wait while permits are free), and once every
// node has left no key of the queue is left.
func TestKeysEvictedByRedisKeepThePromises(t *testing.T) {
	fifo := evictionMode{name: "fifo", cfg: fairqueue.Config{Permits: 2}}
	// kv_tokens keeps the queue to two requests, below the permits (3)
	// and the upstreams' (2 each).
	fair := evictionMode{name: "fair kv_tokens pool", tokens: 2, cfg: fairqueue.Config{Fair: true, KVTokens: 4, Permits: 3,
		Upstreams: []fairqueue.Upstream{{Dial: "u1:1", Permits: 2}, {Dial: "u2:1", Permits: 2}}}}
	fifoTokens := fair
	fifoTokens.name, fifoTokens.cfg.Fair = "fifo kv_tokens pool", false
	for _, tc := range []struct {
		mode evictionMode
		keys []string
	}{
		{fifo, []string{"waiting"}},
		{fair, []string{"fwait", "fticket"}},
		// The fair waiters' order only: their ticket index says they wait.
		{fair, []string{"fwait"}},
		// The ticket index only: the order says they wait.
		{fair, []string{"fticket"}},
		// Each other key that exists at that moment.
		{fifo, []string{"seq"}},
		{fifo, []string{"grants"}},
		{fifo, []string{"members"}},
		{fifo, []string{"nodes"}},
		{fifo, []string{"epoch"}},
		{fifo, []string{"upool"}},
		{fifo, []string{"holders"}},
		{fair, []string{"seq"}},
		{fair, []string{"grants"}},
		{fair, []string{"members"}},
		{fair, []string{"nodes"}},
		{fair, []string{"epoch"}},
		{fair, []string{"upool"}},
		{fair, []string{"holders"}},
		{fair, []string{"tok"}},
		{fair, []string{"thold"}},
		{fair, []string{"tsum"}},
		{fair, []string{"tup"}},
		{fair, []string{"finf"}},
		{fair, []string{"uheld"}},
		{fair, []string{"ulast"}},
		{fair, []string{"fready"}},
		{fair, []string{"fcount"}},
		{fair, []string{"twait"}},
		{fair, []string{"vtime"}},
		{fair, []string{"fidle"}},
		// The keys of kv_tokens and the pool in a FIFO queue.
		{fifoTokens, []string{"waiting"}},
		{fifoTokens, []string{"holders"}},
		{fifoTokens, []string{"tok"}},
		{fifoTokens, []string{"thold"}},
		{fifoTokens, []string{"tsum"}},
		{fifoTokens, []string{"tup"}},
		{fifoTokens, []string{"uheld"}},
		{fifoTokens, []string{"upool"}},
		{fifoTokens, []string{"ulast"}},
	} {
		t.Run(tc.mode.name+" "+strings.Join(tc.keys, "+"), func(t *testing.T) {
			// Each case has its own redis-server and spends its time
			// waiting for heartbeats, not on the CPU.
			t.Parallel()
			evictAtTheWorstMoment(t, tc.mode, tc.keys)
		})
	}
}

// evictionMode is a queue's settings for TestKeysEvictedByRedisKeepThePromises:
// cfg, and the tokens each request weighs.
type evictionMode struct {
	name   string
	cfg    fairqueue.Config
	tokens int
}

// evictAtTheWorstMoment runs TestKeysEvictedByRedisKeepThePromises with
// keys evicted under mode.
func evictAtTheWorstMoment(t *testing.T, mode evictionMode, keys []string) {
	srv := redistest.Start(t)
	cfg := mode.cfg
	cfg.Lease, cfg.PollInterval, cfg.MaxWait = 1500*time.Millisecond, 50*time.Millisecond, 30*time.Second
	beatsA, beatsB := &beatsSince{}, &beatsSince{}
	a := wrappedNode(t, srv, "evicted", cfg, beatsA.wrap)
	b := wrappedNode(t, srv, "evicted", cfg, beatsB.wrap)
	run := newInFlight(cfg)
	req := func(tenant string) fairqueue.Request { return fairqueue.Request{Tenant: tenant, Tokens: mode.tokens} }
	if cfg.Fair {
		// Tenant x served twice: the virtual time moves, and x's counter
		// is kept idle above it.
		for range 2 {
			p, err := a.q.Acquire(context.Background(), req("x"))
			require.NoError(t, err)
			p.Release()
		}
	}
	var held []*fairqueue.Permit
	holders := []fairqueue.Request{req("a1"), req("a2")}
	if mode.tokens > 0 {
		// kv_tokens is full, and a request that weighs no tokens holds
		// the permit left: nobody is granted until the test releases them.
		holders = append(holders, fairqueue.Request{Tenant: "a3"})
	}
	for _, r := range holders {
		p, err := a.q.Acquire(context.Background(), r)
		require.NoError(t, err)
		run.start(p)
		held = append(held, p)
	}
	var wg sync.WaitGroup
	served := make(chan string, 8)
	wait := func(n *node, tenant string) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			p, err := n.q.Acquire(context.Background(), req(tenant))
			if !assert.NoError(t, err, "waiter of tenant %s", tenant) {
				return
			}
			run.start(p)
			time.Sleep(100 * time.Millisecond)
			run.end(p)
			p.Release()
			served <- tenant
		}()
	}
	// More waiters than a release of every permit serves at once.
	for _, tenant := range []string{"b1", "b2", "b3", "b4"} {
		wait(b, tenant)
	}
	eventually(t, 5*time.Second, func() bool { return len(readState(t, a.rdb, "evicted").Waiting) == 4 }, "not queued")
	// Some heartbeats of both nodes pass with the waiters queued: no
	// doubt is left from their acquires. Counted, not timed: two begun
	// after the waiters queued, the first of which may still have been
	// on its way as they did.
	beatsA.from(time.Now())
	beatsB.from(time.Now())
	eventually(t, 30*time.Second, func() bool { return beatsA.count() >= 2 && beatsB.count() >= 2 },
		"no two heartbeats of each node with the waiters queued")

	tag := redisstore.New(a.rdb, "evicted", redisstore.Options{}).Tag()
	beatsA.from(time.Now())
	beatsB.from(time.Now())
	for _, k := range keys {
		require.EqualValues(t, 1, a.rdb.Exists(context.Background(), tag+":"+k).Val(), "no key %s to evict", k)
		require.NoError(t, a.rdb.Del(context.Background(), tag+":"+k).Err())
	}
	// Each node heartbeats every lease/3; from the second heartbeat each
	// has begun after the eviction, every grant counts. Counted, not
	// timed: a loaded machine can delay a heartbeat past any wait.
	eventually(t, 30*time.Second, func() bool { return beatsA.count() >= 2 && beatsB.count() >= 2 },
		"no two heartbeats of each node after the eviction")
	run.strictAfter(time.Now())
	wait(a, "a1")
	wait(b, "b1")
	time.Sleep(200 * time.Millisecond)
	for _, p := range held {
		run.end(p)
		p.Release()
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		t.Fatalf("waiters not served within 20s of the permits being freed (max_wait 30s); served: %d", len(served))
	}
	assert.Len(t, served, 6, "waiters served")
	assert.Empty(t, run.over(), "grants made after every node's heartbeat above the capacity")

	require.NoError(t, a.q.Close())
	require.NoError(t, b.q.Close())
	assert.Empty(t, a.rdb.Keys(context.Background(), tag+"*").Val(), "keys left once every node has left")
}

// beatsSince wraps a node's store to count its heartbeats begun after a
// moment and answered without error.
type beatsSince struct {
	fairqueue.Store
	mu    sync.Mutex
	since time.Time
	n     int
}

func (b *beatsSince) wrap(s fairqueue.Store) fairqueue.Store { b.Store = s; return b }

// from starts the count at at.
func (b *beatsSince) from(at time.Time) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.since, b.n = at, 0
}

func (b *beatsSince) count() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.n
}

func (b *beatsSince) Heartbeat(ctx context.Context, hb fairqueue.HeartbeatArgs) (fairqueue.HeartbeatResult, error) {
	b.mu.Lock()
	since := b.since
	b.mu.Unlock()
	began := time.Now()
	res, err := b.Store.Heartbeat(ctx, hb)
	b.mu.Lock()
	defer b.mu.Unlock()
	if err == nil && !since.IsZero() && !began.Before(since) && since.Equal(b.since) {
		b.n++
	}
	return res, err
}

// inFlight tracks the permits the test's requests hold: in all, in tokens
// and on each upstream, and the grants that found them above the
// capacity after a given time.
type inFlight struct {
	mu         sync.Mutex
	cfg        fairqueue.Config
	n, tokens  int
	on         map[string]int
	strict     time.Time
	overGrants []string
}

func newInFlight(cfg fairqueue.Config) *inFlight {
	return &inFlight{cfg: cfg, on: map[string]int{}}
}

// strictAfter makes every grant from at on count against the capacity.
func (r *inFlight) strictAfter(at time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.strict = at
}

func (r *inFlight) start(p *fairqueue.Permit) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.n++
	r.tokens += p.Tokens()
	u := p.Upstream()
	r.on[u]++
	if r.strict.IsZero() || time.Now().Before(r.strict) {
		return
	}
	permits := r.cfg.Permits
	for _, up := range r.cfg.Upstreams {
		if up.Dial == u && r.on[u] > up.Permits {
			r.overGrants = append(r.overGrants, fmt.Sprintf("%s: %d on upstream %s", p.Ticket(), r.on[u], u))
		}
		if r.cfg.Permits == 0 {
			permits += up.Permits
		}
	}
	if r.n > permits || (r.cfg.KVTokens > 0 && r.tokens > r.cfg.KVTokens) {
		r.overGrants = append(r.overGrants, fmt.Sprintf("%s: %d running, %d tokens", p.Ticket(), r.n, r.tokens))
	}
}

func (r *inFlight) end(p *fairqueue.Permit) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.n--
	r.tokens -= p.Tokens()
	r.on[p.Upstream()]--
}

func (r *inFlight) over() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.overGrants
}

// A fair waiter whose ticket index (K.fticket) Redis evicted still
// waits in its flow's order (K.fwait), and dispatch grants it from
// there. The heartbeat that names it must not report it missing: its
// node would queue it again (reinstate), and the flow's order would hold
// it twice; the second entry is granted once the request has ended, to
// nobody (its node releases the grant at once), and charged to the flow
// again. The heartbeat names the node's oldest waiter only; the others'
// index entries come back with it, so that they count in the queue's
// length (max_queue, positions) and a cancel finds them.
func TestAFairWaiterWhoseIndexWasEvictedIsGrantedOnce(t *testing.T) {
	rdb, s := openStore(t, "indexevicted")
	ctx := context.Background()
	l := fairqueue.Limits{Permits: 1, Lease: 10 * time.Second}
	holder := fairqueue.TicketArgs{ID: "n1:1:a.0", Node: "n1", Limits: l, Cost: 1}
	r := acquireGranted(t, s, holder)
	w1 := fairqueue.TicketArgs{ID: "n1:2:b.0", Node: "n1", Limits: l, Cost: 1}
	w2 := fairqueue.TicketArgs{ID: "n1:3:c.0", Node: "n1", Limits: l, Cost: 1}
	for _, w := range []fairqueue.TicketArgs{w1, w2} {
		q, err := s.Acquire(ctx, w)
		require.NoError(t, err)
		require.False(t, q.Granted, "no permit free")
	}
	require.NoError(t, rdb.Del(ctx, s.Tag()+":fticket").Err()) // evicted

	// The node's heartbeat names its oldest waiter; one found missing is
	// queued again, and the next heartbeat names every waiter (verify).
	pending := []string{w1.ID}
	for beat := uint64(1); beat <= 2; beat++ {
		hb, err := s.Heartbeat(ctx, fairqueue.HeartbeatArgs{Node: "n1", Limits: l, Epoch: r.Epoch, Beat: beat,
			Held: []string{holder.ID}, Pending: pending})
		require.NoError(t, err)
		for _, id := range hb.Missing {
			_, err := s.Acquire(ctx, fairqueue.TicketArgs{ID: id, Node: "n1", Limits: l, Cost: 1})
			require.NoError(t, err)
		}
		if len(hb.Missing) > 0 {
			pending = []string{w1.ID, w2.ID}
		}
	}
	snap, err := s.Inspect(ctx, 0, 0)
	require.NoError(t, err)
	assert.Equal(t, 2, snap.Waiting, "the waiters counted in the queue's length")

	require.NoError(t, s.Release(ctx, holder))
	for _, w := range []fairqueue.TicketArgs{w1, w2} {
		snap, err := s.Inspect(ctx, 0, 0)
		require.NoError(t, err)
		require.Len(t, snap.Holders, 1)
		require.Equal(t, w.ID, snap.Holders[0].Ticket, "granted in arrival order")
		require.NoError(t, s.Release(ctx, w))
	}
	snap, err = s.Inspect(ctx, 0, 0)
	require.NoError(t, err)
	assert.Empty(t, snap.Holders, "a permit held for nobody: a waiter granted again after its request ended")
	assert.EqualValues(t, 3, snap.Grants, "grants made (each charged to its flow)")
	assert.Zero(t, snap.Waiting)
	assert.Zero(t, rdb.Exists(ctx, s.Tag()+":fwait").Val(), "tickets left in their flows' order")
}

// A fair waiter cancelled (its client gone, its max_wait over) after
// Redis evicted the ticket index (K.fticket), before any heartbeat
// rebuilt it, leaves its flow's order too: left there, it was granted
// later to nobody (its node releases such a grant at once) and charged
// to its tenant.
func TestAFairWaiterCancelledAfterItsIndexWasEvictedIsNotGranted(t *testing.T) {
	rdb, s := openStore(t, "cancelevicted")
	ctx := context.Background()
	l := fairqueue.Limits{Permits: 1, Lease: 10 * time.Second}
	holder := fairqueue.TicketArgs{ID: "n1:1:a.0", Node: "n1", Limits: l, Cost: 1}
	acquireGranted(t, s, holder)
	w := fairqueue.TicketArgs{ID: "n1:2:b.0", Node: "n1", Limits: l, Cost: 1}
	q, err := s.Acquire(ctx, w)
	require.NoError(t, err)
	require.False(t, q.Granted, "no permit free")
	require.NoError(t, rdb.Del(ctx, s.Tag()+":fticket").Err()) // evicted

	require.NoError(t, s.Cancel(ctx, w))
	require.NoError(t, s.Release(ctx, holder))
	snap, err := s.Inspect(ctx, 0, 0)
	require.NoError(t, err)
	assert.Empty(t, snap.Holders, "the cancelled waiter granted")
	assert.EqualValues(t, 1, snap.Grants, "grants made (each charged to its flow)")
	assert.Zero(t, rdb.Exists(ctx, s.Tag()+":fwait").Val(), "the cancelled waiter left in its flow's order")
}
