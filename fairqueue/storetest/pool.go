package storetest

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
)

// Upstream pools (Config.Upstreams): each upstream's permits hold across
// nodes, the choice rule, cooldowns, requeue at the request's place, and
// a reload that changes the pool.
func init() {
	cases = append(cases,
		testCase{"ReleaseSentAgainDoesNotExtendTheCooldown", coolSentAgain},
		testCase{"PoolBurstReachesEachUpstreamsPermitsAndNoMore", poolBurst},
		testCase{"PoolPicksTheMostFreeShareThenTheOldestGrant", poolChoice},
		testCase{"CooledUpstreamGetsNoGrantsUntilItsCooldownEnds", poolCooldown},
		testCase{"RequeueServesTheRequestBeforeThoseThatArrivedAfterIt", requeuePlace},
		testCase{"FairRequeueKeepsTheFlowsPlaceAndUndoesItsCharge", requeueFair},
		testCase{"RequeueSentAgainQueuesOnceAndReleasesOnce", requeueTwice},
		testCase{"ReloadRemovingAnUpstreamNeverOverAdmitsThoseThatStay", poolReload},
		testCase{"ReloadAddingAPoolCountsEarlierHoldersOnEveryUpstream", poolAdded},
	)
}

var abc = []fairqueue.Upstream{{Dial: "a:1", Permits: 1}, {Dial: "b:1", Permits: 2}, {Dial: "c:1", Permits: 3}}

// acquireAsync starts an Acquire; its permit (or error) arrives on the
// channel. It waits until the store has the ticket queued (n waiting).
func acquireAsync(t *testing.T, h Harness, name string, q *fairqueue.Queue, req fairqueue.Request, n int) <-chan *fairqueue.Permit {
	t.Helper()
	ch := make(chan *fairqueue.Permit, 1)
	go func() {
		p, err := q.Acquire(bg, req)
		assert.NoError(t, err)
		ch <- p
	}()
	eventually(t, 5*time.Second, func() bool { w, _ := h.State(t, name); return len(w) == n }, "ticket %d not queued", n)
	return ch
}

func await(t *testing.T, ch <-chan *fairqueue.Permit, what string) *fairqueue.Permit {
	t.Helper()
	select {
	case p := <-ch:
		require.NotNil(t, p, what)
		return p
	case <-time.After(10 * time.Second):
		t.Fatalf("%s: not granted", what)
		return nil
	}
}

func notGranted(t *testing.T, ch <-chan *fairqueue.Permit, what string) {
	t.Helper()
	select {
	case p := <-ch:
		t.Fatalf("%s: granted on %q", what, p.Upstream())
	case <-time.After(100 * time.Millisecond):
	}
}

// Two nodes, 90 requests, upstreams of 1, 2 and 3 permits (the pool's
// cap above their sum, so that only theirs bound it): no upstream ever
// runs more than its permits, each reaches them, all are served, and
// nothing is left in the store.
func poolBurst(t *testing.T, h Harness) {
	cfg := fairqueue.Config{Upstreams: abc, Permits: 8, MaxWait: time.Minute}
	nodes := []*fairqueue.Queue{h.NewNode(t, "burst", cfg), h.NewNode(t, "burst", cfg)}
	var mu sync.Mutex
	inside, most := map[string]int{}, map[string]int{}
	total, mostTotal := 0, 0
	var wg sync.WaitGroup
	for i := range 90 {
		q := nodes[i%2]
		wg.Go(func() {
			p, err := q.Acquire(bg, fairqueue.Request{})
			if !assert.NoError(t, err) {
				return
			}
			up := p.Upstream()
			mu.Lock()
			inside[up]++
			total++
			most[up] = max(most[up], inside[up])
			mostTotal = max(mostTotal, total)
			mu.Unlock()
			time.Sleep(time.Duration(1+i%4) * time.Millisecond)
			mu.Lock()
			inside[up]--
			total--
			mu.Unlock()
			p.Release()
		})
	}
	wg.Wait()
	assert.Equal(t, map[string]int{"a:1": 1, "b:1": 2, "c:1": 3}, most, "each upstream at its permits, never more")
	assert.Equal(t, 6, mostTotal)
	waiting, holders := h.State(t, "burst")
	assert.Empty(t, waiting)
	assert.Empty(t, holders)
	snap, err := nodes[0].Inspect(bg, 0, 0)
	require.NoError(t, err)
	assert.Empty(t, snap.Upstreams, "no upstream keeps holders")
}

// At once, grants go to the largest free share, ties to the upstream
// granted longest ago (never granted first, then list order): a, b, c,
// c, b, c. A freed slot goes to the waiter on that upstream. With all
// free again, the oldest last grant goes first: a (grant 1), then c
// (grant 6; b had grant 7).
func poolChoice(t *testing.T, h Harness) {
	q := h.NewNode(t, "choice", fairqueue.Config{Upstreams: abc, MaxWait: time.Minute})
	var got []string
	var ps []*fairqueue.Permit
	for range 6 {
		p, err := q.Acquire(bg, fairqueue.Request{})
		require.NoError(t, err)
		got = append(got, p.Upstream())
		ps = append(ps, p)
	}
	assert.Equal(t, []string{"a:1", "b:1", "c:1", "c:1", "b:1", "c:1"}, got)
	snap, err := q.Inspect(bg, 0, 0)
	require.NoError(t, err)
	assert.Equal(t, []fairqueue.UpstreamInfo{{Dial: "a:1", InFlight: 1}, {Dial: "b:1", InFlight: 2}, {Dial: "c:1", InFlight: 3}}, snap.Upstreams)
	ch := acquireAsync(t, h, "choice", q, fairqueue.Request{}, 1)
	notGranted(t, ch, "every upstream is full")
	ps[1].Release() // b's first
	p := await(t, ch, "the waiter")
	assert.Equal(t, "b:1", p.Upstream())
	p.Release()
	for _, p := range ps {
		p.Release()
	}
	got = nil
	for range 2 {
		p, err := q.Acquire(bg, fairqueue.Request{})
		require.NoError(t, err)
		got = append(got, p.Upstream())
		defer p.Release()
	}
	assert.Equal(t, []string{"a:1", "c:1"}, got, "ties go to the upstream granted longest ago")
}

// An upstream cooled at a release is passed over while it cools, even
// with the most free permits; a waiter that only it could serve waits
// for the cooldown's end, then gets it.
func poolCooldown(t *testing.T, h Harness) {
	q := h.NewNode(t, "cool", fairqueue.Config{Upstreams: []fairqueue.Upstream{{Dial: "a:1", Permits: 1}, {Dial: "b:1", Permits: 1}},
		MaxWait: time.Minute, PollInterval: 50 * time.Millisecond})
	pa, err := q.Acquire(bg, fairqueue.Request{})
	require.NoError(t, err)
	require.Equal(t, "a:1", pa.Upstream())
	pa.Cool(700 * time.Millisecond)
	pa.Release()
	snap, err := q.Inspect(bg, 0, 0)
	require.NoError(t, err)
	require.Len(t, snap.Upstreams, 1)
	assert.Equal(t, "a:1", snap.Upstreams[0].Dial)
	assert.Positive(t, snap.Upstreams[0].CoolLeft)
	pb, err := q.Acquire(bg, fairqueue.Request{})
	require.NoError(t, err)
	assert.Equal(t, "b:1", pb.Upstream(), "a cools")
	ch := acquireAsync(t, h, "cool", q, fairqueue.Request{}, 1)
	notGranted(t, ch, "a cools, b is full")
	p := await(t, ch, "after the cooldown")
	assert.Equal(t, "a:1", p.Upstream())
	p.Release()
	pb.Release()
}

// A requeued request waits at its place: the next free slot is its,
// before the requests that arrived after it; its upstream cools.
func requeuePlace(t *testing.T, h Harness) {
	q := h.NewNode(t, "requeue", fairqueue.Config{Upstreams: []fairqueue.Upstream{{Dial: "a:1", Permits: 1}, {Dial: "b:1", Permits: 1}},
		MaxWait: time.Minute, PollInterval: 50 * time.Millisecond})
	pa, err := q.Acquire(bg, fairqueue.Request{})
	require.NoError(t, err)
	pb, err := q.Acquire(bg, fairqueue.Request{})
	require.NoError(t, err)
	require.Equal(t, "b:1", pb.Upstream())
	w2 := acquireAsync(t, h, "requeue", q, fairqueue.Request{}, 1)
	w3 := acquireAsync(t, h, "requeue", q, fairqueue.Request{}, 2)
	again := make(chan *fairqueue.Permit, 1)
	go func() {
		p, err := pb.Requeue(bg, 30*time.Second) // b answered 503, Retry-After: 30
		assert.NoError(t, err)
		again <- p
	}()
	eventually(t, 5*time.Second, func() bool { w, _ := h.State(t, "requeue"); return len(w) == 3 }, "not requeued")
	notGranted(t, again, "a is held, b cools")
	pa.Release()
	p := await(t, again, "the requeued request")
	assert.Equal(t, "a:1", p.Upstream(), "the slot freed, not the cooling one")
	assert.Equal(t, pb.Seq(), p.Seq(), "it keeps its arrival order")
	notGranted(t, w2, "w2 arrived after it")
	p.Release()
	p2 := await(t, w2, "w2")
	notGranted(t, w3, "w3")
	p2.Release()
	await(t, w3, "w3").Release()
	waiting, holders := h.State(t, "requeue")
	assert.Empty(t, waiting)
	assert.Empty(t, holders)
}

// Fair: a requeued request is not charged for the grant it gave back,
// and its flow keeps its place among the flows (it does not start over).
func requeueFair(t *testing.T, h Harness) {
	q := h.NewNode(t, "requeuefair", fairqueue.Config{Fair: true, Upstreams: []fairqueue.Upstream{{Dial: "a:1", Permits: 1}},
		MaxWait: time.Minute, PollInterval: 50 * time.Millisecond})
	pa, err := q.Acquire(bg, fairqueue.Request{Tenant: "a"})
	require.NoError(t, err)
	wb := acquireAsync(t, h, "requeuefair", q, fairqueue.Request{Tenant: "b"}, 1)
	again := make(chan *fairqueue.Permit, 1)
	go func() {
		p, err := pa.Requeue(bg, -1) // no cooldown
		assert.NoError(t, err)
		again <- p
	}()
	// a's usage goes back to what it was, no more than b's: ties go to
	// the earlier arrival, a's request.
	p := await(t, again, "the requeued request")
	notGranted(t, wb, "b")
	snap, err := q.Inspect(bg, 0, 10)
	require.NoError(t, err)
	for _, f := range snap.Flows {
		if f.Flow == fairqueue.TenantKey("a")+".0" {
			assert.Equal(t, 1.0, f.Usage, "charged once, for the grant it holds")
		}
	}
	p.Release()
	await(t, wb, "b").Release()
}

// Store.Requeue sent twice (a retry after a lost reply) queues the new
// ticket once, releases the old permit once, and the grant it made names
// the freed upstream.
func requeueTwice(t *testing.T, h Harness) {
	s := store(t, h, "requeue2", "n1")
	l := fairqueue.Limits{Permits: 1, Lease: time.Minute, Upstreams: []fairqueue.Upstream{{Dial: "a:1", Permits: 1}}}
	res, err := s.Acquire(bg, ticket("n1:1", "n1", l))
	require.NoError(t, err)
	require.True(t, res.Granted)
	require.Equal(t, "a:1", res.Upstream)
	res, err = s.Acquire(bg, ticket("n1:2", "n1", l))
	require.NoError(t, err)
	require.False(t, res.Granted)
	rq := fairqueue.RequeueArgs{TicketArgs: ticket("n1:3", "n1", l), Old: "n1:1", Seq: 1}
	for range 2 {
		_, err := s.Requeue(bg, rq)
		require.NoError(t, err)
	}
	snap, err := s.(fairqueue.Inspector).Inspect(bg, 10, 0)
	require.NoError(t, err)
	require.Len(t, snap.Holders, 1)
	assert.Equal(t, "n1:3", snap.Holders[0].Ticket, "the requeued ticket, at its place before n1:2")
	assert.Equal(t, "a:1", snap.Holders[0].Upstream)
	assert.Equal(t, 1, snap.Waiting, "n1:2 waits; n1:3 is not queued twice")
	require.NoError(t, s.Leave(bg, "n1", l))
}

// A reload that removes upstream a and adds c: a's holder still counts
// on a (which gets no new grants) and on no other upstream, so c, idle,
// serves a waiter at once; b never runs more than its permit, and the
// waiters are served.
func poolReload(t *testing.T, h Harness) {
	before := fairqueue.Config{Upstreams: []fairqueue.Upstream{{Dial: "a:1", Permits: 1}, {Dial: "b:1", Permits: 1}},
		MaxWait: time.Minute, PollInterval: 50 * time.Millisecond}
	q := h.NewNode(t, "reload", before)
	pa, err := q.Acquire(bg, fairqueue.Request{})
	require.NoError(t, err)
	pb, err := q.Acquire(bg, fairqueue.Request{})
	require.NoError(t, err)
	require.Equal(t, []string{"a:1", "b:1"}, []string{pa.Upstream(), pb.Upstream()})
	w1 := acquireAsync(t, h, "reload", q, fairqueue.Request{}, 1)
	after := before
	after.Upstreams = []fairqueue.Upstream{{Dial: "b:1", Permits: 1}, {Dial: "c:1", Permits: 1}}
	require.NoError(t, q.Reconfigure(after))
	p1 := await(t, w1, "w1, c idle")
	assert.Equal(t, "c:1", p1.Upstream(), "b is held; a is gone")
	w2 := acquireAsync(t, h, "reload", q, fairqueue.Request{}, 1)
	pa.Release()
	notGranted(t, w2, "b and c are held")
	pb.Release()
	p2 := await(t, w2, "w2")
	assert.Equal(t, "b:1", p2.Upstream())
	p1.Release()
	p2.Release()
	ctx, cancel := context.WithTimeout(bg, 5*time.Second)
	defer cancel()
	p, err := q.Acquire(ctx, fairqueue.Request{})
	require.NoError(t, err)
	assert.NotEqual(t, "a:1", p.Upstream(), "a is no longer in the pool")
	p.Release()
}

// A reload that gives a queue a pool: a permit granted before it names
// no upstream, and its request may run on any of them (the old route's
// static upstream is one of the pool's, unknown to the queue), so it
// counts on every upstream until it is released.
func poolAdded(t *testing.T, h Harness) {
	before := fairqueue.Config{Permits: 1, MaxWait: time.Minute, PollInterval: 50 * time.Millisecond}
	q := h.NewNode(t, "added", before)
	p0, err := q.Acquire(bg, fairqueue.Request{})
	require.NoError(t, err)
	require.Empty(t, p0.Upstream())
	w1 := acquireAsync(t, h, "added", q, fairqueue.Request{}, 1)
	after := before
	after.Permits = 0 // the pool's sum
	after.Upstreams = []fairqueue.Upstream{{Dial: "a:1", Permits: 1}, {Dial: "b:1", Permits: 1}}
	require.NoError(t, q.Reconfigure(after))
	w2 := acquireAsync(t, h, "added", q, fairqueue.Request{}, 2)
	// Two pool permits, one held: but the holder may be on a or b.
	notGranted(t, w1, "the earlier holder may run on either upstream")
	p0.Release()
	p1, p2 := await(t, w1, "w1"), await(t, w2, "w2")
	assert.ElementsMatch(t, []string{"a:1", "b:1"}, []string{p1.Upstream(), p2.Upstream()})
	p1.Release()
	p2.Release()
}

// A release sent again (the client's retry after a read timeout, its
// first run done) finds no holder: it must not cool the upstream again
// ("one sent again does not extend the cooldown", memstore/pool.go).
func coolSentAgain(t *testing.T, h Harness) {
	s := store(t, h, "coolagain", "n1")
	l := fairqueue.Limits{Permits: 2, Lease: time.Minute, Upstreams: []fairqueue.Upstream{{Dial: "a:1", Permits: 2}}}
	res, err := s.Acquire(bg, ticket("n1:1", "n1", l))
	require.NoError(t, err)
	require.True(t, res.Granted)
	rel := ticket("n1:1", "n1", l)
	rel.Cool, rel.CoolFor = "a:1", 400*time.Millisecond
	require.NoError(t, s.Release(bg, rel))
	time.Sleep(300 * time.Millisecond)
	require.NoError(t, s.Release(bg, rel)) // sent again: n1:1 holds nothing
	time.Sleep(250 * time.Millisecond)     // 550 ms after the first: its cooldown ended
	res, err = s.Acquire(bg, ticket("n1:2", "n1", l))
	require.NoError(t, err)
	assert.True(t, res.Granted, "a cools 400 ms from the release that freed the permit; the one sent again extended it")
	require.NoError(t, s.Cancel(bg, ticket("n1:2", "n1", l)))
	require.NoError(t, s.Leave(bg, "n1", l))
}
