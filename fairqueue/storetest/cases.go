package storetest

import (
	"context"
	"errors"
	"sort"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
)

var cases = []testCase{
	{"FastPathGrantsAndReleaseFreesThePermit", fastPath},
	{"ThreeNodesNeverExceedPermitsAndGrantInArrivalOrder", arrivalOrder},
	{"TimeoutRejectsWithPositionAndLeavesQueue", timeout},
	{"CancelWhileWaitingLeavesQueueAtOnce", cancelWaiting},
	{"GrantCancelRaceLeaksNothing", grantCancelRace},
	{"DrainAnswersWaitersAndLeavesNothing", drain},
	{"ReleaseHandsPermitToOldestWaiterOnAnotherNode", handoffAcrossNodes},
	{"InspectShowsHoldersWaitersNodesAndFlows", inspect},
}

func inspect(t *testing.T, h Harness) {
	q := h.NewNode(t, "inspect", fairqueue.Config{Permits: 1, Fair: true})
	p, err := q.Acquire(bg, fairqueue.Request{Tenant: "a"})
	require.NoError(t, err)
	defer p.Release()
	ctx, cancel := context.WithCancel(bg)
	defer cancel()
	for i, tenant := range []string{"a", "b", "b"} {
		go func() { _, _ = q.Acquire(ctx, fairqueue.Request{Tenant: tenant}) }()
		eventually(t, 2*time.Second, func() bool { w, _ := h.State(t, "inspect"); return len(w) == i+1 }, "not queued")
	}
	snap, err := q.Inspect(bg, 2, 10)
	require.NoError(t, err)
	assert.Equal(t, 3, snap.Waiting)
	assert.Len(t, snap.Head, 2)
	require.Len(t, snap.Holders, 1)
	assert.Equal(t, p.Ticket(), snap.Holders[0].Ticket)
	assert.Equal(t, q.Node(), snap.Holders[0].Node)
	assert.Greater(t, snap.Holders[0].LeaseLeft, time.Duration(0))
	require.NotEmpty(t, snap.Nodes)
	assert.True(t, snap.Nodes[0].Alive)
	require.Len(t, snap.Flows, 2)
	assert.Equal(t, 2, snap.Flows[0].Waiting, "the busiest flow first")
	assert.Equal(t, fairqueue.TenantKey("b")+".0", snap.Flows[0].Flow)
	// a holds the permit and was charged its cost, 1; b, new, starts
	// at the least usage of the flows waiting: a's.
	assert.Equal(t, fairqueue.FlowInfo{Flow: fairqueue.TenantKey("b") + ".0", Waiting: 2, Held: 0, Usage: 1}, snap.Flows[0])
	assert.Equal(t, fairqueue.FlowInfo{Flow: fairqueue.TenantKey("a") + ".0", Waiting: 1, Held: 1, Usage: 1}, snap.Flows[1])
}

func fastPath(t *testing.T, h Harness) {
	q := h.NewNode(t, "fast", fairqueue.Config{Permits: 2})
	p1, err := q.Acquire(bg, fairqueue.Request{})
	require.NoError(t, err)
	p2, err := q.Acquire(bg, fairqueue.Request{})
	require.NoError(t, err)
	assert.Equal(t, 0, p1.Position(), "granted at once")
	_, holders := h.State(t, "fast")
	assert.Len(t, holders, 2)
	p1.Release()
	p1.Release() // idempotent
	p2.Release()
	_, holders = h.State(t, "fast")
	assert.Empty(t, holders)
}

// Three nodes, sixty goroutines each, four permits: holders never exceed
// the permits, everyone is served, and grants follow the store's arrival
// order (its sequence numbers), not the order goroutines woke up in.
func arrivalOrder(t *testing.T, h Harness) {
	const permits, perNode = 4, 60
	nodes := make([]*fairqueue.Queue, 3)
	for i := range nodes {
		nodes[i] = h.NewNode(t, "order", fairqueue.Config{Permits: permits, MaxWait: time.Minute})
	}
	var inside, maxInside atomic.Int32
	type grant struct{ seq, no int64 }
	var mu sync.Mutex
	var held []*fairqueue.Permit
	var wg sync.WaitGroup
	for i := range perNode * len(nodes) {
		wg.Add(1)
		go func(q *fairqueue.Queue, i int) {
			defer wg.Done()
			p, err := q.Acquire(bg, fairqueue.Request{})
			if !assert.NoError(t, err) {
				return
			}
			c := inside.Add(1)
			for m := maxInside.Load(); c > m && !maxInside.CompareAndSwap(m, c); m = maxInside.Load() {
			}
			GrantNo(t, p) // while held: see GrantNo
			mu.Lock()
			held = append(held, p)
			mu.Unlock()
			time.Sleep(time.Duration(i%5) * time.Millisecond)
			inside.Add(-1)
			p.Release()
		}(nodes[i%len(nodes)], i)
	}
	wg.Wait()
	var grants []grant
	for _, p := range held {
		require.NotZero(t, p.GrantNo(), "grant number of %s", p.Ticket())
		grants = append(grants, grant{p.Seq(), p.GrantNo()})
	}
	require.Len(t, held, perNode*len(nodes), "every acquire succeeds")
	assert.LessOrEqual(t, maxInside.Load(), int32(permits))
	assert.Equal(t, int32(permits), maxInside.Load(), "the permits were used")
	sort.Slice(grants, func(i, j int) bool { return grants[i].no < grants[j].no })
	for i := 1; i < len(grants); i++ {
		require.Less(t, grants[i-1].seq, grants[i].seq, "grant %d (seq %d) after grant %d (seq %d)",
			grants[i].no, grants[i].seq, grants[i-1].no, grants[i-1].seq)
	}
	waiting, holders := h.State(t, "order")
	assert.Empty(t, waiting)
	assert.Empty(t, holders)
}

func timeout(t *testing.T, h Harness) {
	q := h.NewNode(t, "timeout", fairqueue.Config{Permits: 1, MaxWait: 300 * time.Millisecond, PollInterval: 50 * time.Millisecond})
	p, err := q.Acquire(bg, fairqueue.Request{})
	require.NoError(t, err)
	defer p.Release()
	start := time.Now()
	_, err = q.Acquire(bg, fairqueue.Request{})
	var re *fairqueue.RejectError
	require.ErrorAs(t, err, &re)
	assert.ErrorIs(t, err, fairqueue.ErrTimeout)
	assert.Equal(t, fairqueue.ReasonTimeout, re.Reason)
	assert.Equal(t, 1, re.Position, "it was next in line")
	assert.GreaterOrEqual(t, re.RetryAfter, time.Second)
	assert.GreaterOrEqual(t, time.Since(start), 300*time.Millisecond)
	waiting, _ := h.State(t, "timeout")
	assert.Empty(t, waiting)
}

func cancelWaiting(t *testing.T, h Harness) {
	q := h.NewNode(t, "cancel", fairqueue.Config{Permits: 1})
	p, err := q.Acquire(bg, fairqueue.Request{})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(bg)
	done := make(chan error, 1)
	go func() {
		_, err := q.Acquire(ctx, fairqueue.Request{})
		done <- err
	}()
	eventually(t, 2*time.Second, func() bool { w, _ := h.State(t, "cancel"); return len(w) == 1 }, "waiter never queued")
	cancel()
	require.ErrorIs(t, <-done, context.Canceled)
	waiting, _ := h.State(t, "cancel")
	assert.Empty(t, waiting, "gone from the queue as soon as Acquire returned")
	p.Release()
	_, holders := h.State(t, "cancel")
	assert.Empty(t, holders, "the cancelled waiter was not granted")
}

// Grants and cancels racing on two nodes: every permit comes back.
func grantCancelRace(t *testing.T, h Harness) {
	a := h.NewNode(t, "race", fairqueue.Config{Permits: 2, MaxWait: time.Minute})
	b := h.NewNode(t, "race", fairqueue.Config{Permits: 2, MaxWait: time.Minute})
	for _, q := range []*fairqueue.Queue{a, b} { // join first: the race is in the waiting
		p, err := q.Acquire(bg, fairqueue.Request{})
		require.NoError(t, err)
		p.Release()
	}
	var wg sync.WaitGroup
	var served atomic.Int32
	const n = 300
	for i := range n {
		wg.Add(1)
		go func(q *fairqueue.Queue, i int) {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(bg, time.Duration(i%30)*time.Millisecond)
			defer cancel()
			p, err := q.Acquire(ctx, fairqueue.Request{})
			if err != nil {
				if !errors.Is(err, context.DeadlineExceeded) {
					t.Errorf("acquire: %v", err)
				}
				return
			}
			served.Add(1)
			time.Sleep(time.Millisecond)
			p.Release()
		}([]*fairqueue.Queue{a, b}[i%2], i)
		time.Sleep(200 * time.Microsecond)
	}
	wg.Wait()
	t.Logf("served %d of %d", served.Load(), n)
	require.NotZero(t, served.Load())
	require.Less(t, served.Load(), int32(n), "some waiters must have been cancelled")
	waiting, holders := h.State(t, "race")
	assert.Empty(t, waiting)
	assert.Empty(t, holders)
	for range 2 {
		p, err := a.Acquire(bg, fairqueue.Request{})
		require.NoError(t, err, "permits are all free again")
		assert.Equal(t, 0, p.Position())
		defer p.Release()
	}
}

func drain(t *testing.T, h Harness) {
	q := h.NewNode(t, "drain", fairqueue.Config{Permits: 1})
	p, err := q.Acquire(bg, fairqueue.Request{})
	require.NoError(t, err)
	errs := make(chan error, 3)
	for range 3 {
		go func() { _, err := q.Acquire(bg, fairqueue.Request{}); errs <- err }()
	}
	eventually(t, 2*time.Second, func() bool { w, _ := h.State(t, "drain"); return len(w) == 3 }, "waiters never queued")
	drained := make(chan error, 1)
	go func() { drained <- q.Drain(bg) }()
	for range 3 {
		select {
		case err := <-errs:
			assert.ErrorIs(t, err, fairqueue.ErrShuttingDown)
		case <-time.After(2 * time.Second):
			t.Fatal("waiter not answered at once by Drain")
		}
	}
	_, err = q.Acquire(bg, fairqueue.Request{})
	assert.ErrorIs(t, err, fairqueue.ErrShuttingDown, "no admission while draining")
	select {
	case <-drained:
		t.Fatal("Drain returned while a permit was still held")
	case <-time.After(100 * time.Millisecond):
	}
	p.Release()
	require.NoError(t, <-drained)
	waiting, holders := h.State(t, "drain")
	assert.Empty(t, waiting)
	assert.Empty(t, holders)
}

func handoffAcrossNodes(t *testing.T, h Harness) {
	a := h.NewNode(t, "handoff", fairqueue.Config{Permits: 1})
	b := h.NewNode(t, "handoff", fairqueue.Config{Permits: 1})
	c := h.NewNode(t, "handoff", fairqueue.Config{Permits: 1})
	p, err := a.Acquire(bg, fairqueue.Request{})
	require.NoError(t, err)
	got := make(chan string, 2)
	for _, q := range []*fairqueue.Queue{b, c} {
		go func() {
			p, err := q.Acquire(bg, fairqueue.Request{})
			if assert.NoError(t, err) {
				got <- q.Node()
				time.Sleep(20 * time.Millisecond)
				p.Release()
			}
		}()
		eventually(t, 2*time.Second, func() bool { w, _ := h.State(t, "handoff"); return q == c || len(w) == 1 }, "not queued")
	}
	eventually(t, 2*time.Second, func() bool { w, _ := h.State(t, "handoff"); return len(w) == 2 }, "not queued")
	p.Release()
	assert.Equal(t, b.Node(), <-got, "the oldest waiter, on another node, is served first")
	assert.Equal(t, c.Node(), <-got)
}
