package storetest

import (
	"context"
	"fmt"
	"math"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
)

// The differential test of the two stores: rapid draws a queue's settings
// (permits, caps, tokens, a pool, a learned capacity; FIFO or fair) and a
// sequence of store calls (acquire with a tenant, band, weight, cost and
// weight in tokens; acquire sent again; release with a correction and
// perhaps a cooldown; cancel of a waiter or of a holder; requeue, and
// one sent again, at once or late; heartbeat, re-adding a ticket
// released unmarked or adopting a fail-open
// one; a learned share's move; reconcile; a reload's new settings, the
// old ones perhaps still carried beside them: differential_rolling.go), and
// two nodes run it on two stores (the in-process one and Redis), one call
// at a time: n1 makes most calls, n2 (differential_nodes.go) acquires and
// heartbeats, perhaps naming no pool, and either, or a node not in the
// queue, reports a share's window. A grant to the caller's own ticket
// reaches it within the call (memstore calls its Listener; the scripts
// return a caller's own grants); one to the other node's, by the store's
// notification, which the test waits for on Redis (Pub/Sub): no timed
// assertion. After each call the
// grants it made (in grant order, with their numbers and upstreams), its
// answer and the queue as Inspect shows it (waiting, holders with their
// upstreams and weights, tokens held, each flow's backlog, permits and
// usage) must be the same on both. Leases and cooldowns are a minute:
// none ends within a check.
//
// Where the stores may differ, the test does not look:
//   - a position is an estimate (not compared);
//   - after a reload that raised max_in_flight_per_tenant, Redis makes the
//     tenant's flows ready at the next reconcile (docs/design.md): the
//     node reconciles right after each reload, as it does within a poll
//     interval;
//   - a report within fairqueue.HeadsTTL/2 of HeadsTTL after a join is
//     not made: each store reads its own clock (adaptNode);
//   - the node does as a Queue does: a fail-open permit it adopted is
//     never requeued, and a ticket a heartbeat counted again is released
//     again at once.
//
// Replay a failure with its seed, e.g.:
//
//	go test -run 'TestStoresServeTheSameOrder' ./fairqueue/redisstore/ -rapid.seed=1234

var diffRuns atomic.Int64

// DiffStore opens queue name on one store implementation, for
// Differential.
type DiffStore struct {
	// Name names the store in a failure's report.
	Name string
	// Open returns a new handle on queue name, which the test opens as
	// one of its nodes and closes. Handles on one name share the queue
	// (a second node, differential_nodes.go, opens its own).
	Open func(name string) fairqueue.Store
}

// Defaults of rapid's flags for Differential in `go test`: a few seconds.
// A long run: -rapid.checks=5000 -rapid.steps=100.
var diffFlagDefaults = map[string]string{
	"rapid.checks":     "100",
	"rapid.steps":      "50",
	"rapid.nofailfile": "true",
}

// Differential runs the differential test (see the comment above) on
// stores a and b.
func Differential(t *testing.T, a, b DiffStore) {
	defer setFlagDefaults(diffFlagDefaults)()
	rapid.Check(t, func(rt *rapid.T) {
		name := fmt.Sprintf("diff-%d", diffRuns.Add(1))
		d := &diff{rt: rt, lim: withBound(drawLimits(rt))}
		d.fair = rapid.Bool().Draw(rt, "fair")
		d.sides = []*diffSide{{name: a.Name, s: a.Open(name), s2: a.Open(name)}, {name: b.Name, s: b.Open(name), s2: b.Open(name)}}
		for _, s := range d.sides {
			if err := s.s.Open(context.Background(), "n1", &s.rec); err != nil {
				rt.Fatalf("open %s: %v", s.name, err)
			}
			if err := s.s2.Open(context.Background(), "n2", &s.rec2); err != nil {
				rt.Fatalf("open %s as n2: %v", s.name, err)
			}
		}
		defer func() {
			for _, s := range d.sides {
				_ = s.s2.Leave(context.Background(), "n2", d.lim)
				_ = s.s.Leave(context.Background(), "n1", d.lim)
				_ = s.s2.Close()
				_ = s.s.Close()
			}
		}()
		d.logf("limits %s, fair %v", fmtLimits(d.lim), d.fair)
		rt.Repeat(map[string]func(*rapid.T){
			"acquire":      d.acquire,
			"release":      d.release,
			"cancel":       d.cancel,
			"requeue":      d.requeue,
			"requeueAgain": d.requeueAgain,
			"reconcile":    d.reconcile,
			"resend":       d.resend,
			"cancelHeld":   d.cancelHeld,
			"reload":       d.reload,
			"heartbeat":    d.heartbeat,
			"adapt":        d.adapt,
			"acquire2":     d.acquire2,
			"heartbeat2":   d.heartbeat2,
		})
	})
}

// drawLimits draws a queue's settings: permits, caps, tokens, a pool.
func drawLimits(rt *rapid.T) fairqueue.Limits {
	l := fairqueue.Limits{Lease: time.Minute, Permits: rapid.IntRange(1, 4).Draw(rt, "permits")}
	l.MaxInFlightPerTenant = rapid.SampledFrom([]int{0, 0, 1, 2}).Draw(rt, "tenantCap")
	l.MaxQueue = rapid.SampledFrom([]int{0, 0, 4, 8}).Draw(rt, "maxQueue")
	l.MaxQueuePerTenant = rapid.SampledFrom([]int{0, 0, 2, 3}).Draw(rt, "maxQueuePerTenant")
	if rapid.Bool().Draw(rt, "tokens") {
		l.Tokens = rapid.IntRange(4, 12).Draw(rt, "kvTokens")
		l.TokenBound = l.Tokens
	}
	if rapid.Bool().Draw(rt, "pool") {
		l.Upstreams = drawPool(rt, l.Tokens)
	}
	l.Learned = rapid.Bool().Draw(rt, "learned")
	return l
}

// drawPool draws 1-3 upstreams; with tokens (kv > 0), some with their
// own capacity.
func drawPool(rt *rapid.T, kv int) []fairqueue.Upstream {
	var ups []fairqueue.Upstream
	for i := range rapid.IntRange(1, 3).Draw(rt, "upstreams") {
		u := fairqueue.Upstream{Dial: fmt.Sprintf("u%d:80", i), Permits: rapid.IntRange(1, 2).Draw(rt, "upPermits")}
		if kv > 0 && rapid.Bool().Draw(rt, "upTokens") {
			u.KVTokens = rapid.IntRange(3, kv).Draw(rt, "upKV")
		}
		ups = append(ups, u)
	}
	return ups
}

// withBound sets l.TokenBound as a Queue does (Config.ClampTokens): the
// configured capacity (the bound already set, or Tokens), and with a pool
// whose upstreams all set KVTokens, at most the largest of those.
func withBound(l fairqueue.Limits) fairqueue.Limits {
	capacity := max(l.TokenBound, l.Tokens)
	if capacity <= 0 {
		l.TokenBound = 0
		return l
	}
	l.TokenBound, _ = fairqueue.Config{Permits: 1, KVTokens: capacity, Upstreams: l.Upstreams}.ClampTokens(math.MaxInt)
	return l
}

// lessTokensThan is a capacity less r reserved, -1 when nothing is left
// (fairqueue.Limits.Tokens).
func lessTokensThan(capacity, r int) int {
	if capacity <= r {
		return -1
	}
	return capacity - r
}

func fmtLimits(l fairqueue.Limits) string {
	return fmt.Sprintf("permits %d, tenant cap %d, max queue %d/%d per tenant, tokens %d (bound %d), learned %v, upstreams %v",
		l.Permits, l.MaxInFlightPerTenant, l.MaxQueue, l.MaxQueuePerTenant, l.Tokens, l.TokenBound, l.Learned, l.Upstreams)
}

// diff is one check: the two stores, the tickets, the calls so far.
type diff struct {
	rt       *rapid.T
	lim      fairqueue.Limits
	roll     *fairqueue.Limits // a rolling reload's old settings (differential_rolling.go)
	fair     bool
	sides    []*diffSide
	counter  uint64
	beat     uint64
	gone     []*dTicket // released or cancelled
	requeues []dRequeue // every requeue sent, to send again (requeueAgain)
	tickets  []*dTicket
	log      []string
	n2       diffNode2       // the second node (differential_nodes.go)
	joined   map[string]bool // nodes that made a call that joins (noteJoin)
	holdAt   time.Time       // when the last call that may hold a lowering back ran (noteJoin, noteRelease)
}

type diffSide struct {
	name string
	s    fairqueue.Store // n1's handle
	rec  grantRec
	s2   fairqueue.Store // n2's handle
	rec2 grantRec
}

// dTicket is one ticket as the test knows it.
type dTicket struct {
	id      string
	node    string // "n1" or "n2": whose calls it makes
	seq     int64
	cost    float64
	scale   float64 // what one unit of cost adds to its flow's counter
	tokens  int
	asks    int // TicketArgs.Asks: what it asks where its weight was clamped
	up      string
	held    bool
	waiting bool
	adopted bool // admitted without the store, then adopted by a heartbeat
	old     bool // acquired under a rolling reload's old settings
}

// dRequeue is a requeue sent: its arguments and its old ticket.
type dRequeue struct {
	args fairqueue.RequeueArgs
	old  *dTicket
}

// grantRec is the node's Listener: it records the grants it is told of.
type grantRec struct {
	mu sync.Mutex
	gs []fairqueue.Grant
}

func (r *grantRec) Granted(gs ...fairqueue.Grant) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.gs = append(r.gs, gs...)
}

func (r *grantRec) Resynced() {}

func (r *grantRec) take() []fairqueue.Grant {
	r.mu.Lock()
	defer r.mu.Unlock()
	gs := r.gs
	r.gs = nil
	return gs
}

// grantsLike takes the grants both nodes were told of; on a side after
// the first, once they are at least n (or after notifyWait: a grant the
// first store did not make shows as a difference).
func (s *diffSide) grantsLike(i, n int) []fairqueue.Grant {
	gs := append(s.rec.take(), s.rec2.take()...)
	for end := time.Now().Add(notifyWait); i > 0 && len(gs) < n && time.Now().Before(end); {
		time.Sleep(time.Millisecond)
		gs = append(gs, append(s.rec.take(), s.rec2.take()...)...)
	}
	return gs
}

// notifyWait bounds the wait for a grant's notification (Pub/Sub): far
// above its latency on a loaded machine; a grant missing after it is a
// difference.
const notifyWait = 5 * time.Second

func (d *diff) logf(format string, args ...any) {
	d.log = append(d.log, fmt.Sprintf(format, args...))
}

// each runs n1's call on both stores (eachAs).
func (d *diff) each(what string, call func(fairqueue.Store) (string, []fairqueue.Grant, error)) {
	d.eachAs("n1", what, call)
}

// eachAs runs call on both stores, on node's handle, checks that they
// answer alike, make the same grants and show the same queue. The grants
// update the tickets. A grant to the other node's waiter reaches it by
// the store's notification: the first store's (in-process) within the
// call, the second's (Redis Pub/Sub) a moment later, which the test
// waits for (grantsLike) before it compares.
func (d *diff) eachAs(node, what string, call func(fairqueue.Store) (string, []fairqueue.Grant, error)) {
	d.logf("%s", what)
	var outs []string
	want := 0
	for i, s := range d.sides {
		h := s.s
		if node == "n2" {
			h = s.s2
		}
		ans, own, err := call(h)
		if err != nil {
			d.fatalf("%s on %s: %v", what, s.name, err)
		}
		gs := append(own, s.grantsLike(i, want-len(own))...)
		if i == 0 {
			want = len(gs)
		}
		slices.SortFunc(gs, func(a, b fairqueue.Grant) int { return int(a.No - b.No) })
		var b strings.Builder
		b.WriteString(ans)
		for _, g := range gs {
			fmt.Fprintf(&b, " | grant #%d %s on %q", g.No, g.Ticket, g.Upstream)
		}
		b.WriteString(" || " + d.view(s))
		outs = append(outs, b.String())
		if s == d.sides[0] {
			for _, g := range gs {
				for _, t := range d.tickets {
					if t.id == g.Ticket {
						t.held, t.waiting, t.up = true, false, g.Upstream
					}
				}
			}
		}
	}
	if outs[0] != outs[1] {
		d.fatalf("the stores differ after %s:\n  %s: %s\n  %s: %s", what, d.sides[0].name, outs[0], d.sides[1].name, outs[1])
	}
	d.logf("  -> %s", outs[0])
}

// view is the queue as the store shows it: waiting, holders (with
// their upstreams and weights), tokens held, grants, the flows' backlog,
// permits held and usage.
func (d *diff) view(s *diffSide) string {
	in, ok := s.s.(fairqueue.Inspector)
	if !ok {
		return ""
	}
	snap, err := in.Inspect(context.Background(), 0, 100)
	if err != nil {
		d.fatalf("inspect %s: %v", s.name, err)
	}
	var hs []string
	for _, h := range snap.Holders {
		hs = append(hs, fmt.Sprintf("%s@%q/%d", h.Ticket, h.Upstream, h.Tokens))
	}
	slices.Sort(hs)
	var fs []string
	for _, f := range snap.Flows {
		fs = append(fs, fmt.Sprintf("%s w%d h%d u%v", f.Flow[len(f.Flow)-4:], f.Waiting, f.Held, f.Usage))
	}
	slices.Sort(fs)
	return fmt.Sprintf("waiting %d, grants %d, tokens %d, holders %v, flows %v", snap.Waiting, snap.Grants, snap.TokensHeld, hs, fs)
}

func (d *diff) fatalf(format string, args ...any) {
	d.rt.Fatalf("%s\n--- the calls ---\n%s", fmt.Sprintf(format, args...), strings.Join(d.log, "\n"))
}
