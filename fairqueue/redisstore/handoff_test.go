package redisstore_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
	"github.com/fair-queue/caddy-fair-queue/fairqueue/redisstore"
	"github.com/fair-queue/caddy-fair-queue/internal/redistest"
)

// heldTransfers is a Store that holds every Transfer until the test lets
// it through: what the node does before the store hears of a local
// handoff shows.
type heldTransfers struct {
	fairqueue.Store
	calls chan string   // the waiter of each Transfer, as it is called
	go_   chan struct{} // one receive lets one Transfer through
}

func (h *heldTransfers) Transfer(ctx context.Context, t fairqueue.TicketArgs, to string) error {
	h.calls <- to
	<-h.go_
	return h.Store.(fairqueue.Transferrer).Transfer(ctx, t, to)
}

// A node whose own waiter heads the queue hands it a permit that ends
// at once, before the store answers; the store then counts the waiter
// as the holder, never both and never neither, and the queue's order
// stands.
func TestLocalHandoffStartsTheHeadBeforeTheStoreAnswers(t *testing.T) {
	srv := redistest.Start(t)
	ht := &heldTransfers{calls: make(chan string, 8), go_: make(chan struct{})}
	n := wrappedNode(t, srv, "handoff", fairqueue.Config{Permits: 1, MaxWait: 10 * time.Second, Lease: 3 * time.Second},
		func(s fairqueue.Store) fairqueue.Store { ht.Store = s; return ht })
	ctx := context.Background()
	first, err := n.q.Acquire(ctx, fairqueue.Request{})
	require.NoError(t, err)
	type result struct {
		p   *fairqueue.Permit
		err error
	}
	waiters := make([]chan result, 3)
	for i := range waiters {
		waiters[i] = make(chan result, 1)
		go func() {
			p, err := n.q.Acquire(ctx, fairqueue.Request{})
			waiters[i] <- result{p, err}
		}()
		eventually(t, 5*time.Second, func() bool { return len(readState(t, n.rdb, "handoff").Waiting) == i+1 }, "waiter %d queued", i)
	}
	// A first release is a plain one: its reply names the head. The
	// node hands on locally once a heartbeat has confirmed it (the
	// first one after joining reports it joined; the one it kicks at
	// once confirms it).
	alive(t, n)
	first.Release()
	r0 := <-waiters[0]
	require.NoError(t, r0.err)

	// The next release hands on locally: waiter 1 runs while the
	// transfer is still held.
	done := make(chan struct{})
	go func() { r0.p.Release(); close(done) }()
	var to string
	select {
	case to = <-ht.calls:
	case <-time.After(5 * time.Second):
		t.Fatal("no local handoff")
	}
	r1 := <-waiters[1]
	require.NoError(t, r1.err)
	assert.Equal(t, r1.p.Ticket(), to)
	st := readState(t, n.rdb, "handoff")
	assert.Equal(t, []string{r0.p.Ticket()}, st.Holders, "until the store hears of it, the old holder counts")
	assert.Len(t, st.Waiting, 2, "and the waiter still waits there")
	ht.go_ <- struct{}{}
	<-done
	st = readState(t, n.rdb, "handoff")
	assert.Equal(t, []string{r1.p.Ticket()}, st.Holders, "the waiter holds the permit")
	assert.Len(t, st.Waiting, 1)
	assert.Greater(t, r1.p.GrantNo(), r0.p.GrantNo(), "granted in order")
	assert.Greater(t, r1.p.Seq(), r0.p.Seq())
	select {
	case r := <-waiters[2]:
		t.Fatalf("waiter 2 got in beside waiter 1: %v", r)
	case <-time.After(200 * time.Millisecond):
	}
	go func() { r1.p.Release() }()
	select {
	case <-ht.calls:
		ht.go_ <- struct{}{}
	case <-time.After(5 * time.Second):
		t.Fatal("no local handoff to the last waiter")
	}
	r2 := <-waiters[2]
	require.NoError(t, r2.err)
	r2.p.Release()
	eventually(t, 5*time.Second, func() bool { return len(readState(t, n.rdb, "handoff").Holders) == 0 }, "the last permit released")
}

// heads records what a Store tells its node: grants and heads.
type heads struct {
	mu     sync.Mutex
	grants []string
	head   []string
}

func (h *heads) Granted(gs ...fairqueue.Grant) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, g := range gs {
		h.grants = append(h.grants, g.Ticket)
	}
}

func (h *heads) Resynced() {}

func (h *heads) Heads(ids []string, _ int, _ time.Time) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.head = append(h.head, strings.Join(ids, " "))
}

func (h *heads) last() (head string, grants []string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if len(h.head) > 0 {
		head = h.head[len(h.head)-1]
	}
	return head, slices.Clone(h.grants)
}

// openHeads opens queue name in rdb as node, its Listener a heads.
func openHeads(t *testing.T, rdb redis.UniversalClient, name, node string) (*redisstore.Store, *heads) {
	t.Helper()
	s := redisstore.New(rdb, name, redisstore.Options{})
	h := &heads{}
	require.NoError(t, s.Open(context.Background(), node, h))
	t.Cleanup(func() { _ = s.Close() })
	return s, h
}

// ticketOf is ticket id ("<node>:<n>") under l.
func ticketOf(id string, l fairqueue.Limits) fairqueue.TicketArgs {
	node, _, _ := strings.Cut(id, ":")
	return fairqueue.TicketArgs{ID: id, Node: node, Limits: l}
}

// The transfer script: the permit moves from holder to waiter in one
// step, whatever happened meanwhile; it is never counted twice for the
// two, nor lost; and a release or transfer names the node's head only
// where it is the next to be served.
func TestTransferMovesThePermitWhateverHappenedMeanwhile(t *testing.T) {
	ctx := context.Background()
	rdb := redistest.Start(t).Client(t)
	s1, h1 := openHeads(t, rdb, "xfer", "n1")
	s2, _ := openHeads(t, rdb, "xfer", "n2")
	l := fairqueue.Limits{Permits: 1, Lease: 10 * time.Second}
	tk := func(id string) fairqueue.TicketArgs { return ticketOf(id, l) }
	acquire := func(s *redisstore.Store, id string) fairqueue.AcquireResult {
		r, err := s.Acquire(ctx, tk(id))
		require.NoError(t, err)
		return r
	}
	state := func() queueState { return readState(t, rdb, "xfer") }

	require.True(t, acquire(s1, "n1:1").Granted)
	acquire(s1, "n1:2")
	acquire(s2, "n2:3")
	acquire(s1, "n1:4")

	// A release names the node's head when it is the next to be served.
	require.NoError(t, s1.Release(ctx, tk("n1:1")))
	head, grants := h1.last()
	assert.Equal(t, []string{"n1:2"}, grants)
	assert.Equal(t, "", head, "n2:3 is next: not n1's")
	require.NoError(t, s1.Transfer(ctx, tk("n1:2"), "n2:3")) // as if; n2's own would be
	assert.Equal(t, queueState{Waiting: []string{"n1:4"}, Holders: []string{"n2:3"}, Nodes: []string{"n1", "n2"}}, state())
	head, _ = h1.last()
	assert.Equal(t, "n1:4", head, "now n1's waiter heads the queue")

	// Sent again (a client retry): nothing changes.
	require.NoError(t, s1.Transfer(ctx, tk("n1:2"), "n2:3"))
	assert.Equal(t, queueState{Waiting: []string{"n1:4"}, Holders: []string{"n2:3"}, Nodes: []string{"n1", "n2"}}, state())

	// The waiter was granted meanwhile by another release (its message
	// on its way): the holder's permit is free and goes to the next.
	acquire(s2, "n2:5")
	require.NoError(t, s2.Release(ctx, tk("n2:3"))) // grants n1:4
	require.NoError(t, s1.Transfer(ctx, tk("n1:99"), "n1:4"))
	assert.Equal(t, []string{"n1:4"}, state().Holders, "a holder that held nothing frees nothing")
	acquire(s1, "n1:6")
	require.NoError(t, rdb.ZAdd(ctx, "{fair_queue:xfer}:holders", redis.Z{Score: 1e15, Member: "n1:7"}).Err()) // over the permits, as a heartbeat re-adds
	require.NoError(t, s1.Transfer(ctx, tk("n1:7"), "n1:4"))
	st := state()
	assert.Equal(t, []string{"n1:4"}, st.Holders, "n1:7's permit was free: dispatch kept it for n2:5, none free")
	assert.Equal(t, []string{"n2:5", "n1:6"}, st.Waiting)

	// The store lost the holder: the waiter takes a permit of its own.
	require.NoError(t, rdb.ZRem(ctx, "{fair_queue:xfer}:holders", "n1:4").Err())
	require.NoError(t, s1.Transfer(ctx, tk("n1:4"), "n1:6"))
	assert.Equal(t, []string{"n1:6"}, state().Holders)
	assert.Equal(t, []string{"n2:5"}, state().Waiting)

	// The store lost everything (a restart): the waiter, which runs,
	// counts, as a heartbeat counts a held permit it finds missing.
	require.NoError(t, rdb.Del(ctx, "{fair_queue:xfer}:holders", "{fair_queue:xfer}:waiting").Err())
	require.NoError(t, s1.Transfer(ctx, tk("n1:6"), "n2:5"))
	assert.Equal(t, []string{"n2:5"}, state().Holders)
}

// A local handoff's transfer costs one script call of a few commands,
// the same whatever the number of waiters: cheaper than the release it
// replaces.
func TestTransferCostsFewRedisCommands(t *testing.T) {
	ctx := context.Background()
	rdb, s := openStore(t, "xfercost")
	l := fairqueue.Limits{Permits: 1, Lease: 10 * time.Second}
	n := 0
	tk := func() fairqueue.TicketArgs {
		n++
		return fairqueue.TicketArgs{ID: fmt.Sprintf("n1:%d", n), Node: "n1", Limits: l}
	}
	require.NoError(t, s.Transfer(ctx, tk(), "n1:0")) // loads the script
	require.NoError(t, s.Purge(ctx))
	var prev int64
	for _, waiters := range []int{1, 10, 200} {
		h := tk()
		r, err := s.Acquire(ctx, h)
		require.NoError(t, err)
		require.True(t, r.Granted)
		var queued []fairqueue.TicketArgs
		for range waiters + 1 {
			w := tk()
			_, err := s.Acquire(ctx, w)
			require.NoError(t, err)
			queued = append(queued, w)
		}
		all, scripts, by := cost(t, rdb, func() { require.NoError(t, s.Transfer(ctx, h, queued[0].ID)) })
		t.Logf("transfer with %d waiters: %d commands: %v", waiters+1, all, by)
		assert.Equal(t, int64(1), scripts)
		assert.LessOrEqual(t, all, int64(10), "commands per transfer: %v", by)
		if prev != 0 {
			assert.Equal(t, prev, all, "commands per transfer with %d waiters", waiters+1)
		}
		prev = all
		require.NoError(t, s.Purge(ctx))
	}
}
