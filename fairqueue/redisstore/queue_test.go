package redisstore_test

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
	"github.com/fair-queue/caddy-fair-queue/internal/redistest"
)

func TestFastPathGrantsAndReleaseLeavesNothing(t *testing.T) {
	srv := redistest.Start(t)
	n := newNode(t, srv, "fast", fairqueue.Config{Permits: 2})
	ctx := context.Background()
	p1, err := n.q.Acquire(ctx, fairqueue.Request{})
	require.NoError(t, err)
	p2, err := n.q.Acquire(ctx, fairqueue.Request{})
	require.NoError(t, err)
	assert.Equal(t, 0, p1.Position())
	assert.Len(t, readState(t, n.rdb, "fast").Holders, 2)
	p1.Release()
	p1.Release() // idempotent
	p2.Release()
	assert.Empty(t, readState(t, n.rdb, "fast").Holders)
	require.NoError(t, n.q.Close())
	assert.Empty(t, srv.Keys(t, "*"), "a closed queue leaves no keys")
}

// Three nodes, sixty goroutines each, four permits: holders never exceed
// the permits, everyone is served, and grants follow Redis' arrival order.
func TestThreeNodesNeverExceedPermitsAndGrantInArrivalOrder(t *testing.T) {
	srv := redistest.Start(t)
	const permits, perNode = 4, 60
	nodes := make([]*node, 3)
	for i := range nodes {
		nodes[i] = newNode(t, srv, "order", fairqueue.Config{Permits: permits, MaxWait: time.Minute})
	}
	var inside, maxInside atomic.Int32
	type grant struct{ seq, no int64 }
	var mu sync.Mutex
	var grants []grant
	var wg sync.WaitGroup
	for i := 0; i < perNode*len(nodes); i++ {
		wg.Add(1)
		go func(n *node, i int) {
			defer wg.Done()
			p, err := n.q.Acquire(context.Background(), fairqueue.Request{})
			if !assert.NoError(t, err) {
				return
			}
			c := inside.Add(1)
			for {
				m := maxInside.Load()
				if c <= m || maxInside.CompareAndSwap(m, c) {
					break
				}
			}
			mu.Lock()
			grants = append(grants, grant{p.Seq(), p.GrantNo()})
			mu.Unlock()
			time.Sleep(time.Duration(i%5) * time.Millisecond)
			inside.Add(-1)
			p.Release()
		}(nodes[i%len(nodes)], i)
	}
	wg.Wait()
	require.Len(t, grants, perNode*len(nodes))
	assert.LessOrEqual(t, maxInside.Load(), int32(permits))
	assert.Equal(t, int32(permits), maxInside.Load(), "the permits were used")
	sort.Slice(grants, func(i, j int) bool { return grants[i].no < grants[j].no })
	for i := 1; i < len(grants); i++ {
		require.NotZero(t, grants[i].no, "grant number known")
		require.Less(t, grants[i-1].seq, grants[i].seq, "grant %d (seq %d) after grant %d (seq %d)", grants[i].no, grants[i].seq, grants[i-1].no, grants[i-1].seq)
	}
	st := readState(t, nodes[0].rdb, "order")
	assert.Empty(t, st.Waiting)
	assert.Empty(t, st.Holders)
}

func TestTimeoutRejectsWithPositionAndLeavesQueue(t *testing.T) {
	srv := redistest.Start(t)
	n := newNode(t, srv, "timeout", fairqueue.Config{Permits: 1, MaxWait: 300 * time.Millisecond, PollInterval: 50 * time.Millisecond})
	p, err := n.q.Acquire(context.Background(), fairqueue.Request{})
	require.NoError(t, err)
	defer p.Release()
	start := time.Now()
	_, err = n.q.Acquire(context.Background(), fairqueue.Request{})
	var re *fairqueue.RejectError
	require.ErrorAs(t, err, &re)
	assert.ErrorIs(t, err, fairqueue.ErrTimeout)
	assert.Equal(t, fairqueue.ReasonTimeout, re.Reason)
	assert.Equal(t, 1, re.Position)
	assert.GreaterOrEqual(t, re.RetryAfter, time.Second)
	assert.GreaterOrEqual(t, time.Since(start), 300*time.Millisecond)
	assert.Empty(t, readState(t, n.rdb, "timeout").Waiting)
}

func TestCancelWhileWaitingLeavesQueueAtOnce(t *testing.T) {
	srv := redistest.Start(t)
	n := newNode(t, srv, "cancel", fairqueue.Config{Permits: 1})
	p, err := n.q.Acquire(context.Background(), fairqueue.Request{})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		_, err := n.q.Acquire(ctx, fairqueue.Request{})
		done <- err
	}()
	eventually(t, 2*time.Second, func() bool { return len(readState(t, n.rdb, "cancel").Waiting) == 1 }, "waiter never queued")
	cancel()
	require.ErrorIs(t, <-done, context.Canceled)
	assert.Empty(t, readState(t, n.rdb, "cancel").Waiting)
	p.Release()
	assert.Empty(t, readState(t, n.rdb, "cancel").Holders, "the cancelled waiter was not granted")
}

// Grants and cancels racing: every permit comes back, nothing leaks.
func TestGrantCancelRaceLeaksNothing(t *testing.T) {
	srv := redistest.Start(t)
	a := newNode(t, srv, "race", fairqueue.Config{Permits: 2, MaxWait: time.Minute})
	b := newNode(t, srv, "race", fairqueue.Config{Permits: 2, MaxWait: time.Minute})
	for _, n := range []*node{a, b} { // join first: the race is in the waiting
		p, err := n.q.Acquire(context.Background(), fairqueue.Request{})
		require.NoError(t, err)
		p.Release()
	}
	var wg sync.WaitGroup
	var served atomic.Int32
	for i := 0; i < 300; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			n := a
			if i%2 == 1 {
				n = b
			}
			ctx, cancel := context.WithTimeout(context.Background(), time.Duration(i%30)*time.Millisecond)
			defer cancel()
			p, err := n.q.Acquire(ctx, fairqueue.Request{})
			if err != nil {
				if !errors.Is(err, context.DeadlineExceeded) {
					t.Errorf("acquire: %v", err)
				}
				return
			}
			served.Add(1)
			time.Sleep(time.Millisecond)
			p.Release()
		}(i)
		time.Sleep(200 * time.Microsecond)
	}
	wg.Wait()
	t.Logf("served %d of 300", served.Load())
	require.NotZero(t, served.Load())
	require.Less(t, served.Load(), int32(300), "some waiters must have been cancelled")
	st := readState(t, a.rdb, "race")
	assert.Empty(t, st.Waiting)
	assert.Empty(t, st.Holders)
	p, err := a.q.Acquire(context.Background(), fairqueue.Request{})
	require.NoError(t, err, "permits are all free again")
	assert.Equal(t, 0, p.Position())
	p.Release()
}
