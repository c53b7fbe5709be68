package memstore

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
)

// The usage counter rules of fair.go, pinned call by call on one store
// with a fake clock and nodes that record their grants.

var bg = context.Background()

// recorder is a node's Listener: it keeps the grants it was told of.
type recorder struct{ got []string }

func (r *recorder) Granted(gs ...fairqueue.Grant) {
	for _, g := range gs {
		r.got = append(r.got, g.Ticket)
	}
}
func (r *recorder) Resynced() {}

type fixture struct {
	t   *testing.T
	s   *Store
	now time.Time
	l   fairqueue.Limits
	rec map[string]*recorder
	n   int    // ticket counter
	hbs uint64 // heartbeat counter
}

// newFixture opens node n1 on a new store with permits and the tenant
// in-flight cap inCap (0: none).
func newFixture(t *testing.T, permits, inCap int) *fixture {
	f := &fixture{t: t, s: New(), now: time.Unix(1_000_000, 0), rec: map[string]*recorder{},
		l: fairqueue.Limits{Permits: permits, Lease: time.Minute, MaxInFlightPerTenant: inCap}}
	f.s.now = func() time.Time { return f.now }
	f.open("n1")
	return f
}

// open registers node and makes it alive.
func (f *fixture) open(node string) {
	f.rec[node] = &recorder{}
	require.NoError(f.t, f.s.Open(bg, node, f.rec[node]))
	f.beat(node, fairqueue.HeartbeatArgs{})
}

func (f *fixture) beat(node string, hb fairqueue.HeartbeatArgs) fairqueue.HeartbeatResult {
	f.hbs++
	hb.Node, hb.Limits, hb.Beat = node, f.l, f.hbs
	res, err := f.s.Heartbeat(bg, hb)
	require.NoError(f.t, err)
	return res
}

// flowOf is the flow name of tenant (a letter, repeated as a 16-hex key)
// in band.
func flowOf(tenant string, band int) string {
	return strings.Repeat(tenant, 16) + "." + strconv.Itoa(band)
}

// ticket returns a new ticket ID of node in flowName.
func (f *fixture) ticket(node, flowName string) string {
	f.n++
	return fairqueue.TicketID{Node: node, Counter: uint64(f.n), Flow: flowName}.String()
}

// acquire sends a new ticket of n1 in flowName with cost and returns its
// ID and the answer.
func (f *fixture) acquire(flowName string, cost float64) (string, fairqueue.AcquireResult) {
	id := f.ticket("n1", flowName)
	return id, f.acquireID(id, cost)
}

func (f *fixture) acquireID(id string, cost float64) fairqueue.AcquireResult {
	res, err := f.s.Acquire(bg, fairqueue.TicketArgs{ID: id, Node: fairqueue.TicketNode(id), Limits: f.l, Cost: cost})
	require.NoError(f.t, err)
	return res
}

// granted acquires a ticket that must be granted at once.
func (f *fixture) granted(flowName string, cost float64) string {
	id, res := f.acquire(flowName, cost)
	require.True(f.t, res.Granted, "%s granted on the fast path", id)
	return id
}

// queued acquires a ticket that must be queued.
func (f *fixture) queued(flowName string, cost float64) string {
	id, res := f.acquire(flowName, cost)
	require.False(f.t, res.Granted, "%s queued", id)
	require.NotZero(f.t, res.Position)
	return id
}

// release releases id with correction and returns the tickets the
// dispatch that followed granted.
func (f *fixture) release(id string, correction float64) []string {
	require.NoError(f.t, f.s.Release(bg, fairqueue.TicketArgs{ID: id, Node: fairqueue.TicketNode(id), Limits: f.l, Correction: correction}))
	return f.grants()
}

func (f *fixture) cancel(id string) []string {
	require.NoError(f.t, f.s.Cancel(bg, fairqueue.TicketArgs{ID: id, Node: fairqueue.TicketNode(id), Limits: f.l}))
	return f.grants()
}

// grants returns (and forgets) the grants the nodes were told of.
func (f *fixture) grants() []string {
	var all []string
	for _, r := range f.rec {
		all = append(all, r.got...)
		r.got = nil
	}
	return all
}

func (f *fixture) counter(flowName string) float64 {
	fl := f.s.flows[flowName]
	require.NotNil(f.t, fl, "flow %s active", flowName)
	return fl.counter
}

// drain releases the holder named while there are grants, returning
// every ticket granted in order.
func (f *fixture) drain(first string) []string {
	var order []string
	next := []string{first}
	for len(next) > 0 {
		require.Len(f.t, next, 1)
		got := f.release(next[0], 0)
		order = append(order, got...)
		next = got
	}
	return order
}

// clean asserts no fair state is left but idle counters above V (once
// a Reconcile pruned them).
func (f *fixture) clean() {
	f.t.Helper()
	_, err := f.s.Reconcile(bg, "n1", f.l)
	require.NoError(f.t, err)
	assert.Empty(f.t, f.s.holders, "holders")
	assert.Empty(f.t, f.s.index, "waiters")
	assert.Empty(f.t, f.s.flows, "active flows")
	assert.Empty(f.t, f.s.tenantIn, "tenant in-flight")
	for n, c := range f.s.idle {
		assert.Greater(f.t, c, f.s.vtime, "idle counter of %s above V", n)
	}
}

// (1) A flow coming back with nothing waiting or held, its idle counter
// forgotten, starts at the least counter of the ready flows, neither at
// 0 nor at V: it does not jump the backlog it finds.
func TestFairReturningFlowStartsAtTheLeastReadyCounter(t *testing.T) {
	f := newFixture(t, 1, 0)
	c, d := flowOf("c", 0), flowOf("d", 0)
	f.release(f.granted(d, 1), 0) // D used 1 and left, at 1 > V = 0
	assert.Equal(t, map[string]float64{d: 1}, f.s.idle)
	hold := f.granted(c, 1) // C: 0 -> 1
	var cs []string
	for range 4 {
		cs = append(cs, f.queued(c, 1))
	}
	for i := range 3 { // C's grants raise V to 3, C to 4
		assert.Equal(t, []string{cs[i]}, f.release(hold, 0))
		hold = cs[i]
	}
	assert.Equal(t, 3.0, f.s.vtime)
	assert.Equal(t, 4.0, f.counter(c))
	_, err := f.s.Reconcile(bg, "n1", f.l)
	require.NoError(t, err)
	assert.Empty(t, f.s.idle, "D's idle counter 1 <= V is pruned")

	d1 := f.queued(d, 1)
	assert.Equal(t, 4.0, f.counter(d), "the least ready counter (C's), not 0 or V")
	assert.Equal(t, []string{cs[3], d1}, f.drain(hold), "tie at 4: C's head arrived first")
	f.clean()
}

// (2) A flow with a permit in use and nothing waiting is not new: its
// next request keeps its (lower) counter and is served before the
// backlog of a flow that used more.
func TestFairActiveFlowKeepsItsCounter(t *testing.T) {
	f := newFixture(t, 2, 0)
	l, h := flowOf("1", 0), flowOf("2", 0)
	l1 := f.granted(l, 1) // L: 0 -> 1, held throughout
	hold := f.granted(h, 1)
	var hs []string
	for range 4 {
		hs = append(hs, f.queued(h, 1))
	}
	for i := range 2 {
		assert.Equal(t, []string{hs[i]}, f.release(hold, 0))
		hold = hs[i]
	}
	assert.Equal(t, 3.0, f.counter(h))
	assert.Equal(t, 2.0, f.s.vtime)
	l2 := f.queued(l, 1)
	assert.Equal(t, 1.0, f.counter(l), "L keeps its counter while l1 is held")
	assert.Equal(t, []string{l2}, f.release(hold, 0), "L (1) before H's backlog (3)")
	assert.Equal(t, []string{hs[2]}, f.release(l1, 0))
	assert.Equal(t, []string{hs[3]}, f.release(l2, 0))
	assert.NotContains(t, f.s.idle, l, "L left at 2 <= V 3: nothing kept")
	f.release(hs[2], 0)
	f.release(hs[3], 0)
	f.clean()
}

// (3) Flows at the same counter are served by the arrival of their
// heads, not by name.
func TestFairTiesGoByArrival(t *testing.T) {
	f := newFixture(t, 1, 0)
	x := f.granted(flowOf("c", 0), 1)
	var want []string
	for _, tenant := range []string{"f", "8", "1", "a"} {
		want = append(want, f.queued(flowOf(tenant, 0), 1))
	}
	assert.Equal(t, want, f.drain(x))
	f.clean()
}

// (4) MaxInFlightPerTenant 1, counted over the tenant's bands: the fast
// path is refused to the capped tenant with a permit free, dispatch
// passes over its waiter (though its counter is lower) and serves it
// once the tenant's permit is released.
func TestFairInFlightCap(t *testing.T) {
	f := newFixture(t, 2, 1)
	t0, t1, u := flowOf("e", 0), flowOf("e", 1), flowOf("b", 0)
	e1 := f.granted(t0, 1)
	e2 := f.queued(t1, 1) // another band of the same tenant: capped
	assert.Len(t, f.s.holders, 1, "a permit is free")
	assert.Equal(t, 1, f.s.tenantIn[flowTenant(t0)])
	u1 := f.granted(u, 1) // E's waiter is not ready: no one is ahead
	u2 := f.queued(u, 1)
	assert.Less(t, f.counter(t1), f.counter(u))
	assert.Equal(t, []string{u2}, f.release(u1, 0), "E's waiter is passed over")
	assert.Equal(t, []string{e2}, f.release(e1, 0), "E's waiter once E's permit is back")
	f.release(u2, 0)
	f.release(e2, 0)
	f.clean()
}

// (5) The correction at release moves the counter: a ticket that used
// less than its estimate brings its flow ahead; one that used more
// leaves a debt its flow finds again when it comes back.
func TestFairCorrectionMovesTheCounter(t *testing.T) {
	f := newFixture(t, 1, 0)
	a, b := flowOf("a", 0), flowOf("b", 0)
	f.release(f.granted(b, 1), 0) // B idle at 1
	a1 := f.granted(a, 1)         // A: 0 -> 1
	b2 := f.queued(b, 1)          // B back at its idle counter 1
	assert.Equal(t, 1.0, f.counter(b))
	a2 := f.queued(a, 1) // tie at 1, b2 arrived first ...
	assert.Equal(t, []string{a2}, f.release(a1, -0.5), "... but a1 used less: A at 0.5")
	assert.Equal(t, 1.5, f.counter(a))
	assert.Equal(t, []string{b2}, f.release(a2, 10), "a2 used 11")
	assert.Equal(t, map[string]float64{a: 11.5}, f.s.idle, "A leaves with its debt")
	f.release(b2, 0)
	assert.Equal(t, 1.0, f.s.vtime)
	a3 := f.granted(a, 1) // back at its debt, not at V
	assert.Equal(t, 11.5, f.s.vtime, "charged from 11.5")
	assert.Equal(t, 12.5, f.counter(a))
	f.release(a3, 0)
	f.clean()
}

// (6) When V passes 1e9 every counter, idle ones too, is moved down by V:
// the order stays.
func TestFairRebaseKeepsTheOrder(t *testing.T) {
	f := newFixture(t, 1, 0)
	h, l := flowOf("9", 0), flowOf("1", 0)
	const huge = 6e8
	h1 := f.granted(h, huge) // H: 0 -> 6e8
	h2 := f.queued(h, huge)
	h3 := f.queued(h, huge)
	l1 := f.queued(l, 1) // L starts at H's 6e8
	l2 := f.queued(l, 1)
	assert.Equal(t, huge, f.counter(l))
	assert.Equal(t, []string{h2}, f.release(h1, 0), "tie at 6e8: h2 first")
	assert.Equal(t, []string{l1}, f.release(h2, 0))
	assert.Equal(t, []string{l2}, f.release(l1, 0))
	assert.Equal(t, []string{h3}, f.release(l2, 0), "V reaches 1.2e9: rebase")
	assert.Zero(t, f.s.vtime)
	assert.Equal(t, huge, f.counter(h))
	assert.InDelta(t, 2-huge, f.s.idle[l], 1e-6, "L's idle counter moved down too")
	l3 := f.queued(l, 1) // no flow ready: L starts at max(idle, V) = 0
	h4 := f.queued(h, huge)
	assert.Zero(t, f.counter(l))
	assert.Equal(t, []string{l3, h4}, f.drain(h3))
	f.clean()
}

// (7) Inside a flow, tickets are granted in arrival order whatever their
// cost, also when one of them is cancelled; positions are estimated by
// rounds of the ready flows.
func TestFairFIFOInsideAFlowAndPositions(t *testing.T) {
	f := newFixture(t, 1, 0)
	a, b, c := flowOf("a", 0), flowOf("b", 0), flowOf("c", 0)
	x := f.granted(c, 1)
	queue := func(flowName string, cost float64, pos int) string {
		id, res := f.acquire(flowName, cost)
		require.False(t, res.Granted)
		assert.Equal(t, pos, res.Position, "position of %s", id)
		return id
	}
	a1 := queue(a, 3, 1)
	a2 := queue(a, 2, 2)
	b1 := queue(b, 1, 2) // one A round ahead: a1
	a3 := queue(a, 1, 4) // a1 b1 a2 a3
	a4 := queue(a, 0.5, 5)
	assert.Equal(t, 5, f.acquireID(a4, 0.5).Position, "asked again: the same estimate")
	assert.Empty(t, f.cancel(b1), "the permit is held")
	assert.NotContains(t, f.s.flows, b, "B's only waiter left: B idle")
	f.cancel(a2)
	assert.Equal(t, []string{a1, a3, a4}, f.drain(x))
	f.clean()
}

// (8) Nothing is left once every ticket is gone, whichever way it went:
// released, cancelled waiting or granted, lease expired, node left,
// dropped as a dead node's waiter, adopted by a heartbeat.
func TestFairNoStateLeft(t *testing.T) {
	f := newFixture(t, 2, 1)
	f.open("n2")
	a, b, c := flowOf("a", 0), flowOf("b", 1), flowOf("c", 2)
	a1 := f.granted(a, 1)
	b1 := f.granted(b, 1)
	a2 := f.queued(a, 1)
	c1 := f.queued(c, 1)
	f.cancel(a2)                                // cancelled waiting
	assert.Equal(t, []string{c1}, f.cancel(b1)) // cancelled granted
	n2w := f.ticket("n2", b)
	assert.False(t, f.acquireID(n2w, 1).Granted)
	// n1 stays alive; n2 dies; a1 and c1 keep their leases renewed until
	// they are let go.
	f.now = f.now.Add(50 * time.Second)
	f.beat("n1", fairqueue.HeartbeatArgs{Held: []string{a1, c1}})
	f.now = f.now.Add(20 * time.Second) // n2 is dead; no lease ended
	f.beat("n1", fairqueue.HeartbeatArgs{Held: []string{a1, c1}})
	assert.Empty(t, f.release(a1, 0), "n2's waiter is dropped, not granted")
	assert.NotContains(t, f.s.flows, b, "B's only waiter was dropped")
	// A heartbeat adopts a permit admitted while the store was away.
	adopted := f.ticket("n1", a)
	hb := f.beat("n1", fairqueue.HeartbeatArgs{Held: []string{c1}, Adopt: []string{adopted}, Pending: []string{n2w}})
	assert.Equal(t, []string{n2w}, hb.Missing)
	assert.Equal(t, 1, f.s.flows[a].inflight, "the adopted permit counts")
	assert.Zero(t, f.s.vtime)
	assert.Equal(t, 1.0, f.counter(a), "at max(its idle counter 1, V 0), no charge")
	_, res := f.acquire(c, 1)
	assert.False(t, res.Granted, "C is at its cap, the permits are taken")
	f.now = f.now.Add(2 * time.Minute) // every lease ends
	f.beat("n1", fairqueue.HeartbeatArgs{})
	_, err := f.s.Reconcile(bg, "n1", f.l) // c1 and the adopted expire; the waiter is served
	require.NoError(t, err)
	assert.Len(t, f.grants(), 1)
	require.NoError(t, f.s.Leave(bg, "n1", f.l)) // releases the last permit
	assert.Equal(t, 1.0, f.s.vtime)
	assert.Equal(t, map[string]float64{c: 2}, f.s.idle, "A's idle counter 1 <= V pruned at Leave")
	f.clean()
}

// Purge forgets the fair state.
func TestFairPurge(t *testing.T) {
	f := newFixture(t, 1, 0)
	x := f.granted(flowOf("a", 0), 5)
	f.queued(flowOf("a", 0), 1)
	f.release(f.queued(flowOf("b", 0), 1), 0) // not a holder: nothing happens
	assert.Len(t, f.s.index, 2)
	require.NoError(t, f.s.Purge(bg))
	f.clean()
	assert.Empty(t, f.s.idle)
	assert.Zero(t, f.s.vtime)
	f.release(x, 0)
	f.clean()
}

// While a reload toggles Fair, FIFO and fair tickets wait together:
// dispatch serves the earlier arrival of the FIFO head and the next
// flow's head. State lists the FIFO tickets first, Inspect's head the
// flows' heads first.
func TestFairAndFIFOTogether(t *testing.T) {
	f := newFixture(t, 1, 0)
	a, b := flowOf("a", 0), flowOf("b", 0)
	x := f.granted(a, 1)
	f1 := f.queued("", 1)
	a1 := f.queued(a, 1)
	b1 := f.queued(b, 1)
	f2 := f.queued("", 1)
	assert.Equal(t, 1.0, f.counter(b), "B starts at A's counter")
	assert.Equal(t, []string{f1, f2, a1, b1}, f.s.State().Waiting)
	snap, err := f.s.Inspect(bg, 3, 10)
	require.NoError(t, err)
	assert.Equal(t, 4, snap.Waiting)
	assert.Equal(t, []string{a1, b1, f1}, snap.Head)
	// A holds x (charged 1, V 0); B started at A's counter.
	assert.Equal(t, []fairqueue.FlowInfo{{Flow: a, Waiting: 1, Held: 1, Usage: 1}, {Flow: b, Waiting: 1, Usage: 1}}, snap.Flows)
	assert.Equal(t, []string{f1, a1, b1, f2}, f.drain(x))
	f.clean()
}
