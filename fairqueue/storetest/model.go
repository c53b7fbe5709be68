package storetest

// The model-based test of a queue under faults (issue 12).
//
// rapid (pgregory.net/rapid) draws, per check, a small cluster (2-3 nodes,
// each a fairqueue.Queue of its own on the same queue of one store, with
// 1-3 permits, the shortest lease and poll interval) and a sequence of
// actions: start Acquires, cancel waiters, release permits, make a node's
// link to the store lossy or healthy again, let time pass, restart the
// store empty, crash a node. Between each node and its store sits a
// faultyLink, which under a lossy spell runs a call normally, twice (a
// client re-sending a script after a read timeout: PITFALLS #1), without
// its reply (the call ran, the caller sees an error), or not at all, and
// drops grant notifications (Pub/Sub is at most once: PITFALLS #2).
//
// A small reference model (which requests hold a permit: their Acquire
// returned one and they have not released it) is checked throughout:
//
//  1. permits: a grant made in a healthy period (see syncWindow) leaves at
//     most Permits held by callers;
//  2. every Acquire answers, once, within MaxWait + answerMargin;
//  3. order: requests that lived in a healthy period are granted in their
//     arrival order (the store's Seq, compared with its grant numbers);
//  4. after the run (links healed, permits released, every node closed)
//     nothing of the queue is left in the store, and no goroutine is;
//  5. progress: in a healthy period, no request waits longer than
//     progressBound while a permit is free (no stranded waiter).
//
// A failure prints its seed; replay it with, e.g.:
//
//	go test -race -run 'TestModel' ./fairqueue/memstore/ -rapid.seed=1234
//
// (the package list before the -rapid flags: go test hands the test
// binary every flag after the first one it does not know). make soak is
// the long run.
//
// The run is timed, so a replay repeats the actions, not every
// interleaving. The log of the failing run is a timeline: the actions,
// each Acquire's answer, each fault a link injected, the engine's logs.

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"pgregory.net/rapid"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
)

// ModelHarness gives the model-based test what it needs of one Store
// implementation.
type ModelHarness struct {
	// NewStore returns the store of one new node of queue name (nodes of
	// one name share its permits) and, if not nil, a function that frees
	// what it holds (its client) once the node's Queue is closed.
	NewStore func(name string) (store fairqueue.Store, free func())
	// Restart makes the store lose every queue's data and drop its
	// connections, as a restart without persistence does. nil: the store
	// cannot lose its data (an in-process store); the model does not try.
	Restart func() error
	// Leftovers lists what is left of queue name in the store (keys,
	// holders, waiters); empty when nothing is.
	Leftovers func(name string) ([]string, error)
}

// The cluster's settings: the shortest lease and poll interval a Config
// allows, so that leases end and heartbeats run within a short run.
const (
	modelLease   = fairqueue.MinLease        // 1s: nodes heartbeat every 333ms
	modelPoll    = fairqueue.MinPollInterval // 50ms
	modelMaxWait = 3 * time.Second
)

// The windows of the invariants.
const (
	// answerMargin is how long after its MaxWait an Acquire may still
	// answer: its cleanup after a timeout makes one store call bounded by
	// StoreTimeout (1s by default).
	answerMargin = 2 * time.Second
	// schedSlack absorbs the scheduling delays of a loaded 2-core machine
	// under -race on top of the engine's own bounds below.
	schedSlack = 300 * time.Millisecond
	// syncWindow is how long after the last lossy link healed, or after a
	// restart, the store may not yet count every permit a caller holds,
	// and may still deliver grants it made meanwhile:
	//   - a node whose heartbeats failed for a lease was forgotten and its
	//     leases ended: its first heartbeat back (within Lease/3 +
	//     PollInterval: the loop ticks at the poll interval) rejoins and
	//     re-adds nothing; the heartbeat it sends right after counts its
	//     running permits again (README, "Known limits"; an engine that
	//     waited Lease/3 for that second heartbeat is covered as well);
	//   - after a restart, each node's next heartbeat (within Lease/3 +
	//     PollInterval) re-registers its permits;
	//   - a grant made meanwhile whose notification was lost reaches its
	//     waiter by the next reconcile (PollInterval; Redis gives a fresh
	//     grant's message 100ms before reconcile reports it).
	// That is at most 2*(Lease/3 + PollInterval) = 767ms, rounded up to
	// Lease + PollInterval, plus schedSlack. A grant made in a window may
	// put callers above Permits; such a permit stays exempt while it is
	// held (the store counts it once synced, so no grant is made on top:
	// that is checked). Outside windows a grant never may.
	syncWindow = modelLease + modelPoll + schedSlack
	// crashWindow is how long after a crash the crashed node's permits may
	// still be held in the store for nobody: until their lease ends; a
	// waiter of it granted just before its liveness ran out holds its
	// permit one more lease (README, "Known limits": 2 x lease). Permits
	// held for nobody only delay others (no over-admission), so a crash
	// opens a window for the progress check only.
	crashWindow = 2*modelLease + modelPoll + schedSlack
	// progressBound is how long a waiter may wait while a permit is free,
	// outside every window, before it counts as stranded: a release hands
	// its permit on at once; a lost notification is found by the next
	// reconcile; a permit held for nobody (its release failed while a
	// link was lossy) ends with its lease.
	progressBound = modelLease + modelPoll + schedSlack
)

// Defaults of rapid's flags for a short run in `go test`: about 30s per
// store on a loaded 2-core machine. `make soak` sets them for a long run.
// A fail file is not written by default (it would land in the package's
// testdata); the seed rapid prints replays the run.
var modelFlagDefaults = map[string]string{
	"rapid.checks":     "10",
	"rapid.steps":      "30",
	"rapid.nofailfile": "true",
}

var modelRuns atomic.Int64

// Model runs the model-based test of a queue under faults on h's store
// (see the comment at the top of this file).
func Model(t *testing.T, h ModelHarness) {
	defer setFlagDefaults(modelFlagDefaults)()
	rapid.Check(t, func(rt *rapid.T) {
		m := newModel(rt, h)
		rt.Repeat(m.actions())
		m.finish()
	})
}

// setFlagDefaults sets the flags not given on the command line (or as
// RAPID_* environment variables) to defaults, and returns the undo.
func setFlagDefaults(defaults map[string]string) (restore func()) {
	given := map[string]bool{}
	flag.Visit(func(f *flag.Flag) { given[f.Name] = true })
	var undo []func()
	for name, v := range defaults {
		f := flag.Lookup(name)
		env := strings.ToUpper(strings.ReplaceAll(name, ".", "_"))
		if _, inEnv := os.LookupEnv(env); f == nil || given[name] || inEnv {
			continue
		}
		old := f.Value.String()
		if f.Value.Set(v) == nil {
			undo = append(undo, func() { _ = f.Value.Set(old) })
		}
	}
	return func() {
		for _, u := range undo {
			u()
		}
	}
}

// model is one check: the cluster, its requests, the reference state.
type model struct {
	rt         *rapid.T
	h          ModelHarness
	name       string
	permits    int
	begin      time.Time
	goroutines int // before the check
	nodes      []*modelNode
	wg         sync.WaitGroup // the Acquire goroutines
	quiet      atomic.Bool    // the check is over: log nothing more
	tlMu       sync.Mutex
	timeline   []string
	stopped    bool
	crashes    int
	outages    int

	mu          sync.Mutex
	reqs        []*request
	held        int       // requests holding a permit (the reference model)
	freeSince   time.Time // since when fewer than permits are held; zero while all are
	lossy       int       // links lossy now
	restarting  bool
	lastHeal    time.Time // the last lossy link healed
	lastRestart time.Time
	lastCrash   time.Time
	era         int // bumped by every fault event: requests of one era saw none
	autoRelease bool
	closing     bool
	violations  []string
}

type modelNode struct {
	i       int
	q       *fairqueue.Queue
	link    *faultyLink
	free    func()
	crashed bool // main goroutine only
	closed  bool
}

// request is one Acquire. Fields after start are guarded by model.mu.
type request struct {
	no     int
	node   *modelNode
	cancel context.CancelFunc
	start  time.Time
	era    int  // the era it started in
	clean  bool // it started outside every window
	probe  bool // started by finish, in a healthy period: it must be served

	cancelled bool // by the test: its client left
	abandoned bool // its node crashed
	done      bool
	permit    *fairqueue.Permit
	holding   bool
	orderly   bool // started and granted in one era, outside windows
	reported  bool // a timing violation was reported
}

func newModel(rt *rapid.T, h ModelHarness) *model {
	m := &model{rt: rt, h: h, begin: time.Now(), goroutines: runtime.NumGoroutine()}
	m.freeSince = m.begin
	m.name = fmt.Sprintf("model-%d", modelRuns.Add(1))
	rt.Cleanup(m.stop)
	nodes := rapid.IntRange(2, 3).Draw(rt, "nodes")
	m.permits = rapid.IntRange(1, 3).Draw(rt, "permits")
	enc := zap.NewDevelopmentEncoderConfig()
	enc.EncodeTime = func(t time.Time, e zapcore.PrimitiveArrayEncoder) {
		e.AppendString(fmt.Sprintf("%6dms", t.Sub(m.begin).Milliseconds()))
	}
	logger := zap.New(zapcore.NewCore(zapcore.NewConsoleEncoder(enc), zapcore.AddSync(logWriter{m}), zap.InfoLevel))
	for i := range nodes {
		store, free := h.NewStore(m.name)
		n := &modelNode{i: i, free: free, link: &faultyLink{inner: store, node: i, logf: m.logf}}
		q, err := fairqueue.New(n.link, fairqueue.Config{Name: m.name, Permits: m.permits, MaxWait: modelMaxWait,
			PollInterval: modelPoll, Lease: modelLease, Logger: logger.With(zap.Int("n", i))})
		if err != nil {
			if free != nil {
				free()
			}
			m.fatalf("new queue: %v", err)
		}
		n.q = q
		m.nodes = append(m.nodes, n)
	}
	m.logf("queue %s: %d nodes, %d permits, lease %s, poll %s, max wait %s", m.name, nodes, m.permits,
		modelLease, modelPoll, modelMaxWait)
	return m
}

func (m *model) actions() map[string]func(*rapid.T) {
	a := map[string]func(*rapid.T){
		"":        m.check,
		"acquire": m.acquire,
		"cancel":  m.cancelWaiter,
		"release": m.release,
		"link":    m.toggleLink,
		"sleep":   m.sleep,
		"outage":  m.outage,
		"crash":   m.crash,
	}
	if m.h.Restart != nil {
		a["restart"] = m.restart
	}
	return a
}

// timelineLines is how much of a run's timeline a failure shows: its end.
const timelineLines = 800

// logf writes a line of the run's timeline. A failure shows the timeline
// of the run that failed: a timed run may not fail again when replayed.
func (m *model) logf(format string, args ...any) {
	m.addLine(fmt.Sprintf("%6dms ", time.Since(m.begin).Milliseconds()) + fmt.Sprintf(format, args...))
}

func (m *model) addLine(line string) {
	m.tlMu.Lock()
	defer m.tlMu.Unlock()
	if !m.quiet.Load() {
		m.timeline = append(m.timeline, line)
	}
}

// fatalf fails the check with a message and the timeline of the run.
func (m *model) fatalf(format string, args ...any) {
	m.rt.Fatalf("%s", m.withTimeline(fmt.Sprintf(format, args...)))
}

func (m *model) withTimeline(msg string) string {
	m.tlMu.Lock()
	defer m.tlMu.Unlock()
	tl := m.timeline[max(len(m.timeline)-timelineLines, 0):]
	return fmt.Sprintf("%s\n--- the run's timeline (last %d lines; ms since its start) ---\n%s", msg, len(tl), strings.Join(tl, "\n"))
}

// logWriter hands the engine's zap logs to the timeline.
type logWriter struct{ m *model }

func (w logWriter) Write(p []byte) (int, error) {
	w.m.addLine(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// violate records a broken invariant; the next check reports it. Called
// with m.mu held.
func (m *model) violate(format string, args ...any) {
	msg := fmt.Sprintf("%6dms ", time.Since(m.begin).Milliseconds()) + fmt.Sprintf(format, args...)
	m.violations = append(m.violations, msg)
}

// --- windows ---

func since(now, t time.Time) time.Duration {
	if t.IsZero() {
		return time.Duration(1<<63 - 1)
	}
	return now.Sub(t)
}

// healthy reports whether now lies outside every window of invariant 1:
// no link lossy, none healed and no restart within syncWindow.
func (m *model) healthy(now time.Time) bool {
	return m.lossy == 0 && !m.restarting && since(now, m.lastHeal) >= syncWindow && since(now, m.lastRestart) >= syncWindow
}

// healthySince returns when the current healthy period of invariant 5
// began (zero: at the start), and false when now is not in one (a window
// of invariant 1, or a crash within crashWindow).
func (m *model) healthySince(now time.Time) (time.Time, bool) {
	if !m.healthy(now) || since(now, m.lastCrash) < crashWindow {
		return time.Time{}, false
	}
	var from time.Time
	for _, t := range []time.Time{m.lastHeal, m.lastRestart} {
		if !t.IsZero() && t.Add(syncWindow).After(from) {
			from = t.Add(syncWindow)
		}
	}
	if !m.lastCrash.IsZero() && m.lastCrash.Add(crashWindow).After(from) {
		from = m.lastCrash.Add(crashWindow)
	}
	return from, true
}

// --- the reference model ---

func (m *model) hold(r *request) {
	r.holding = true
	m.held++
	if m.held >= m.permits {
		m.freeSince = time.Time{}
	}
}

func (m *model) unhold(r *request, now time.Time) {
	if !r.holding {
		return
	}
	r.holding = false
	m.held--
	if m.held < m.permits && m.freeSince.IsZero() {
		m.freeSince = now
	}
}

func (m *model) holders() []string {
	var out []string
	for _, r := range m.reqs {
		if r.holding {
			out = append(out, fmt.Sprintf("#%d(node %d, %s)", r.no, r.node.i, r.permit.Ticket()))
		}
	}
	return out
}

// answered records an Acquire's answer and checks invariants 1 and 2.
func (m *model) answered(r *request, p *fairqueue.Permit, err error) {
	now := time.Now()
	release := false
	m.mu.Lock()
	r.done = true
	waited := now.Sub(r.start)
	if waited > modelMaxWait+answerMargin && !r.reported {
		m.violate("invariant 2 (answer in time): acquire #%d on node %d answered after %s (max wait %s)",
			r.no, r.node.i, waited.Round(time.Millisecond), modelMaxWait)
	}
	if (p == nil) == (err == nil) {
		m.violate("acquire #%d on node %d returned permit %v and error %v", r.no, r.node.i, p, err)
	}
	switch {
	case p == nil:
		m.logf("acquire #%d on node %d: %v (after %s)", r.no, r.node.i, err, waited.Round(time.Millisecond))
		switch {
		case r.probe:
			m.violate("invariant 5 (progress): probe acquire #%d on node %d, started once the run had healed and "+
				"every permit was given back, was not served: %v", r.no, r.node.i, err)
		case r.clean && r.era == m.era && m.healthy(now) && !r.abandoned && !expected(err, r.cancelled, m.closing):
			m.violate("acquire #%d on node %d failed in a healthy period: %v", r.no, r.node.i, err)
		}
	case r.abandoned:
		// Its process crashed: the permit is held in the store for nobody
		// until its lease ends. The Release call fails on the dead link.
		m.logf("acquire #%d on node %d (crashed): permit %s, abandoned", r.no, r.node.i, p.Ticket())
		r.permit, release = p, true
	default:
		r.permit = p
		m.hold(r)
		r.orderly = r.clean && r.era == m.era && m.healthy(now)
		m.logf("acquire #%d on node %d: permit %s seq %d grant %d (after %s, %d held)", r.no, r.node.i, p.Ticket(),
			p.Seq(), p.GrantNo(), waited.Round(time.Millisecond), m.held)
		if m.healthy(now) && m.held > m.permits {
			m.violate("invariant 1 (permits): acquire #%d on node %d granted %s while callers hold %d permits of %d, "+
				"in a healthy period (last heal %s, last restart %s); holders %v", r.no, r.node.i, p.Ticket(), m.held,
				m.permits, m.ago(now, m.lastHeal), m.ago(now, m.lastRestart), m.holders())
		}
		if m.autoRelease || r.cancelled {
			// The run is ending, or its client left while the grant raced
			// the cancel: the caller gives the permit back at once.
			m.unhold(r, now)
			release = true
		}
	}
	m.mu.Unlock()
	if release {
		p.Release()
	}
}

// expected reports whether err is an answer a healthy queue gives.
func expected(err error, cancelled, closing bool) bool {
	return errors.Is(err, fairqueue.ErrTimeout) ||
		(cancelled && errors.Is(err, context.Canceled)) ||
		(closing && errors.Is(err, fairqueue.ErrShuttingDown))
}

func (m *model) ago(now, t time.Time) string {
	if t.IsZero() {
		return "never"
	}
	return now.Sub(t).Round(time.Millisecond).String() + " ago"
}

// check is run after every action: invariants 2 and 5, and reports what
// the goroutines found.
func (m *model) check(rt *rapid.T) {
	m.mu.Lock()
	m.checkTimes(time.Now())
	v := m.violations
	m.mu.Unlock()
	if len(v) > 0 {
		m.fatalf("%d invariant(s) broken:\n%s", len(v), strings.Join(v, "\n"))
	}
}

// checkTimes checks invariants 2 (no Acquire runs past its bound) and 5
// (no waiter waits while a permit is free, in a healthy period). Called
// with m.mu held.
func (m *model) checkTimes(now time.Time) {
	for _, r := range m.reqs {
		if !r.done && !r.reported && now.Sub(r.start) > modelMaxWait+answerMargin {
			r.reported = true
			m.violate("invariant 2 (answer in time): acquire #%d on node %d has not answered after %s (max wait %s)",
				r.no, r.node.i, now.Sub(r.start).Round(time.Millisecond), modelMaxWait)
		}
	}
	from, ok := m.healthySince(now)
	if !ok || m.held >= m.permits {
		return
	}
	from = latest(from, m.freeSince)
	for _, r := range m.reqs {
		if r.done || r.cancelled || r.abandoned || r.reported {
			continue
		}
		if w := now.Sub(latest(from, r.start)); w > progressBound {
			r.reported = true
			m.violate("invariant 5 (progress): acquire #%d on node %d waits since %s ago while %d of %d permits are free "+
				"(since %s), in a healthy period (last heal %s, last restart %s, last crash %s)", r.no, r.node.i,
				now.Sub(r.start).Round(time.Millisecond), m.permits-m.held, m.permits, m.ago(now, m.freeSince),
				m.ago(now, m.lastHeal), m.ago(now, m.lastRestart), m.ago(now, m.lastCrash))
		}
	}
}

func latest(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// --- actions ---

// acquire starts 1-3 Acquires on a node, each in its own goroutine with
// its own context.
func (m *model) acquire(rt *rapid.T) {
	n := m.nodes[rapid.IntRange(0, len(m.nodes)-1).Draw(rt, "node")]
	if n.crashed {
		rt.Skip("node crashed")
	}
	for range rapid.IntRange(1, 3).Draw(rt, "count") {
		m.startAcquire(n, false)
	}
}

func (m *model) startAcquire(n *modelNode, probe bool) {
	ctx, cancel := context.WithCancel(context.Background())
	m.mu.Lock()
	now := time.Now()
	r := &request{no: len(m.reqs) + 1, node: n, cancel: cancel, start: now, era: m.era, clean: m.healthy(now), probe: probe}
	m.reqs = append(m.reqs, r)
	m.mu.Unlock()
	if probe {
		m.logf("acquire #%d on node %d (probe)", r.no, n.i)
	} else {
		m.logf("acquire #%d on node %d", r.no, n.i)
	}
	m.wg.Add(1)
	go func() {
		defer m.wg.Done()
		defer cancel()
		p, err := n.q.Acquire(ctx, fairqueue.Request{})
		m.answered(r, p, err)
	}()
}

// pick draws one of the requests that match, or skips the action.
func (m *model) pick(rt *rapid.T, label string, match func(*request) bool) *request {
	m.mu.Lock()
	var rs []*request
	for _, r := range m.reqs {
		if match(r) {
			rs = append(rs, r)
		}
	}
	m.mu.Unlock()
	if len(rs) == 0 {
		rt.Skip("no " + label)
	}
	return rs[rapid.IntRange(0, len(rs)-1).Draw(rt, label)]
}

// cancelWaiter cancels the context of a request that waits: its client
// left.
func (m *model) cancelWaiter(rt *rapid.T) {
	r := m.pick(rt, "waiter", func(r *request) bool { return !r.done && !r.cancelled && !r.abandoned })
	m.mu.Lock()
	r.cancelled = true
	m.mu.Unlock()
	m.logf("cancel #%d on node %d", r.no, r.node.i)
	r.cancel()
}

// release gives back a held permit. The model forgets the holder before
// the store call, so that it never counts fewer holders than the store.
func (m *model) release(rt *rapid.T) {
	r := m.pick(rt, "holder", func(r *request) bool { return r.holding })
	m.mu.Lock()
	holding := r.holding
	m.unhold(r, time.Now())
	m.mu.Unlock()
	if holding {
		m.logf("release #%d on node %d (%s)", r.no, r.node.i, r.permit.Ticket())
		r.permit.Release()
	}
}

var allFaults = []fault{faultPass, faultTwice, faultLost, faultFail}

// toggleLink makes a node's link lossy (with faults rapid draws) or
// healthy again.
func (m *model) toggleLink(rt *rapid.T) {
	n := m.nodes[rapid.IntRange(0, len(m.nodes)-1).Draw(rt, "node")]
	if n.crashed {
		rt.Skip("node crashed")
	}
	if n.link.isLossy() {
		m.heal(n)
		return
	}
	script := rapid.SliceOfN(rapid.SampledFrom(allFaults), 1, 8).Draw(rt, "faults")
	lose := rapid.SliceOfN(rapid.Bool(), 1, 4).Draw(rt, "grantsLost")
	n.link.makeLossy(script, lose)
	m.mu.Lock()
	m.lossy++
	m.era++
	m.mu.Unlock()
	m.logf("link of node %d lossy: calls %v, grant notifications lost %v", n.i, script, lose)
}

func (m *model) heal(n *modelNode) {
	if !n.link.isLossy() {
		return
	}
	n.link.makeHealthy()
	m.mu.Lock()
	m.lossy--
	m.lastHeal = time.Now()
	m.era++
	m.mu.Unlock()
	m.logf("link of node %d healthy", n.i)
}

// sleep lets time pass.
func (m *model) sleep(rt *rapid.T) {
	time.Sleep(time.Duration(rapid.IntRange(20, 300).Draw(rt, "ms")) * time.Millisecond)
}

// maxOutages bounds the outages of one check, to keep a check short: one
// per 15 steps (-rapid.steps), at least 2.
func maxOutages() int {
	steps := 30
	if f := flag.Lookup("rapid.steps"); f != nil {
		if n, err := strconv.Atoi(f.Value.String()); err == nil {
			steps = n
		}
	}
	return max(2, steps/15)
}

// outage lets a lease pass while a link is lossy, long enough for leases
// to end and nodes to be forgotten.
func (m *model) outage(rt *rapid.T) {
	m.mu.Lock()
	lossy := m.lossy
	m.mu.Unlock()
	if lossy == 0 || m.outages >= maxOutages() {
		rt.Skip("no outage")
	}
	m.outages++
	ms := rapid.IntRange(int(modelLease.Milliseconds()), int((modelLease+4*modelPoll).Milliseconds())).Draw(rt, "ms")
	time.Sleep(time.Duration(ms) * time.Millisecond)
}

// restart makes the store lose its data.
func (m *model) restart(rt *rapid.T) {
	m.mu.Lock()
	m.restarting = true
	m.era++
	m.mu.Unlock()
	m.logf("restart the store")
	err := m.h.Restart()
	m.mu.Lock()
	m.restarting = false
	m.lastRestart = time.Now()
	m.era++
	m.mu.Unlock()
	if err != nil {
		m.fatalf("restart: %v", err)
	}
	m.logf("store restarted")
}

// crash stops a node for good without Drain: every call of its link
// fails from now on, its waiters' clients leave and its permits are
// abandoned (held in the store for nobody until their leases end). At
// most one crash per check, and one node always stays up.
func (m *model) crash(rt *rapid.T) {
	var live []*modelNode
	for _, n := range m.nodes {
		if !n.crashed {
			live = append(live, n)
		}
	}
	if m.crashes > 0 || len(live) < 2 {
		rt.Skip("no crash")
	}
	n := live[rapid.IntRange(0, len(live)-1).Draw(rt, "node")]
	wasLossy := n.link.isLossy()
	n.link.kill()
	n.crashed = true
	m.crashes++
	now := time.Now()
	var cancels []context.CancelFunc
	m.mu.Lock()
	if wasLossy {
		m.lossy--
		m.lastHeal = now // its calls in flight may still land
	}
	m.lastCrash = now
	m.era++
	for _, r := range m.reqs {
		if r.node != n {
			continue
		}
		if !r.done {
			r.abandoned = true
			cancels = append(cancels, r.cancel)
		}
		if r.holding {
			r.abandoned = true
			m.unhold(r, now)
		}
	}
	m.mu.Unlock()
	m.logf("node %d crashed", n.i)
	for _, c := range cancels {
		c()
	}
}

// --- the end of a check ---

// finish heals every link, lets the windows pass, releases every permit
// (and every permit granted from now on), waits for every Acquire, closes
// every node, and checks invariants 2-5 on the way.
func (m *model) finish() {
	for _, n := range m.nodes {
		if !n.crashed {
			m.heal(n)
		}
	}
	m.logf("teardown: every link healthy; waiting for the windows to pass")
	m.waitFor("the windows to pass", crashWindow+time.Second, func(now time.Time) bool {
		_, ok := m.healthySince(now)
		return ok
	})
	m.mu.Lock()
	m.autoRelease = true
	var held []*request
	for _, r := range m.reqs {
		if r.holding {
			m.unhold(r, time.Now())
			held = append(held, r)
		}
	}
	m.mu.Unlock()
	m.logf("teardown: releasing %d permits; every later grant is released at once", len(held))
	for _, r := range held {
		r.permit.Release()
	}
	// Probes: in a healthy period with every permit given back, a new
	// request on any live node is served (a node stuck down, a dead
	// subscription, a ticket stranded at the head would time out).
	for _, n := range m.nodes {
		if !n.crashed {
			m.startAcquire(n, true)
			m.startAcquire(n, true)
		}
	}
	m.waitFor("every Acquire to answer", modelMaxWait+answerMargin+time.Second, func(time.Time) bool {
		for _, r := range m.reqs {
			if !r.done {
				return false
			}
		}
		return true
	})
	m.checkOrder()
	m.logf("teardown: closing the nodes")
	m.mu.Lock()
	m.closing = true
	m.mu.Unlock()
	for _, n := range m.closeOrder() {
		err := m.closeNode(n)
		if err != nil && !n.crashed {
			m.fatalf("invariant 4 (clean close): close node %d: %v", n.i, err)
		}
	}
	m.wg.Wait() // every Acquire answered above
	m.checkLeftovers()
	m.checkGoroutines()
	m.mu.Lock()
	v := m.violations
	m.mu.Unlock()
	if len(v) > 0 {
		m.fatalf("%d invariant(s) broken:\n%s", len(v), strings.Join(v, "\n"))
	}
}

// waitFor polls cond (with m.mu held) until it holds, checking the timed
// invariants meanwhile; it fails the check after d.
func (m *model) waitFor(what string, d time.Duration, cond func(now time.Time) bool) {
	deadline := time.Now().Add(d)
	for {
		now := time.Now()
		m.mu.Lock()
		m.checkTimes(now)
		ok := cond(now)
		v := m.violations
		m.mu.Unlock()
		if len(v) > 0 {
			m.fatalf("%d invariant(s) broken:\n%s", len(v), strings.Join(v, "\n"))
		}
		if ok {
			return
		}
		if now.After(deadline) {
			m.fatalf("teardown: waited %s for %s", d, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// checkOrder checks invariant 3: the permits of requests that lived in
// one healthy era were granted in the store's arrival order. The store
// numbers arrivals (Seq) and grants (GrantNo), afresh after it lost its
// data: only requests of one era are compared. A grant found by
// reconcile before its notification has no number and is left out.
func (m *model) checkOrder() {
	m.mu.Lock()
	defer m.mu.Unlock()
	type grant struct {
		no, era  int
		seq, gno int64
	}
	var gs []grant
	for _, r := range m.reqs {
		if r.orderly {
			if seq, gno := r.permit.Seq(), r.permit.GrantNo(); seq > 0 && gno > 0 {
				gs = append(gs, grant{r.no, r.era, seq, gno})
			}
		}
	}
	slices.SortFunc(gs, func(a, b grant) int {
		if a.era != b.era {
			return a.era - b.era
		}
		return int(a.seq - b.seq)
	})
	for i := 1; i < len(gs); i++ {
		if a, b := gs[i-1], gs[i]; a.era == b.era && b.gno < a.gno {
			m.violate("invariant 3 (order): acquire #%d (seq %d) was granted as %d, before acquire #%d (seq %d), granted as %d",
				b.no, b.seq, b.gno, a.no, a.seq, a.gno)
		}
	}
}

// closeOrder is crashed nodes first: the last node to leave deletes the
// queue's keys, once the crashed nodes' entries have ended.
func (m *model) closeOrder() []*modelNode {
	out := slices.Clone(m.nodes)
	slices.SortStableFunc(out, func(a, b *modelNode) int {
		switch {
		case a.crashed == b.crashed:
			return 0
		case a.crashed:
			return -1
		}
		return 1
	})
	return out
}

func (m *model) closeNode(n *modelNode) error {
	if n.closed {
		return nil
	}
	n.closed = true
	err := n.q.Close()
	if n.free != nil {
		n.free()
	}
	return err
}

// checkLeftovers checks invariant 4: nothing of the queue is left in the
// store once every node closed. Nothing runs in the store after the last
// node left, but an entry whose lease or liveness ends may be reaped by
// that last call only: it gets up to one lease to settle.
func (m *model) checkLeftovers() {
	deadline := time.Now().Add(modelLease)
	for {
		left, err := m.h.Leftovers(m.name)
		if err != nil {
			m.fatalf("leftovers: %v", err)
		}
		if len(left) == 0 {
			return
		}
		if time.Now().After(deadline) {
			m.mu.Lock()
			m.violate("invariant 4 (clean close): left in the store after every node closed: %v", left)
			m.mu.Unlock()
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// checkGoroutines checks that the check's goroutines (Acquires, nodes'
// loops, subscriptions, background calls) all ended.
func (m *model) checkGoroutines() {
	deadline := time.Now().Add(3 * time.Second)
	for runtime.NumGoroutine() > m.goroutines {
		if time.Now().After(deadline) {
			buf := make([]byte, 1<<16)
			buf = buf[:runtime.Stack(buf, true)]
			m.mu.Lock()
			m.violate("invariant 4 (no leak): %d goroutines after the check, %d before:\n%s",
				runtime.NumGoroutine(), m.goroutines, buf)
			m.mu.Unlock()
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// stop ends whatever a failed check left running: it cancels every
// request, closes every node and waits for the goroutines. It runs after
// every check (a rapid cleanup); after finish there is nothing left to do.
func (m *model) stop() {
	if m.stopped {
		return
	}
	m.stopped = true
	defer m.quiet.Store(true)
	m.mu.Lock()
	m.autoRelease, m.closing = true, true
	var held []*request
	for _, r := range m.reqs {
		r.cancel()
		if r.holding {
			m.unhold(r, time.Now())
			held = append(held, r)
		}
	}
	m.mu.Unlock()
	for _, r := range held {
		r.permit.Release()
	}
	for _, n := range m.nodes {
		if !n.crashed {
			n.link.makeHealthy()
		}
	}
	for _, n := range m.closeOrder() {
		_ = m.closeNode(n)
	}
	done := make(chan struct{})
	go func() {
		m.wg.Wait()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(modelMaxWait + answerMargin):
		m.rt.Errorf("%s", m.withTimeline(fmt.Sprintf("acquires still running %s after their node closed", modelMaxWait+answerMargin)))
	}
}

// --- the faulty link between a node and its store ---

// fault is what a lossy link does with one store call.
type fault string

const (
	faultPass  fault = "pass"  // the call runs, its answer is returned
	faultTwice fault = "twice" // it runs twice, the second answer is returned (a client retry after a read timeout)
	faultLost  fault = "lost"  // it runs, its answer is lost: the caller sees an error
	faultFail  fault = "fail"  // it does not run: the caller sees an error
)

var (
	errReplyLost   = errors.New("model: reply lost")
	errUnreachable = errors.New("model: store unreachable")
)

type linkState int

const (
	linkHealthy linkState = iota
	linkLossy
	linkDead // the node crashed: nothing passes
)

// faultyLink is a node's link to its store: a fairqueue.Store that
// forwards every call to inner, and the fairqueue.Handler it registers,
// forwarding grants to the node. While lossy, each call meets the next
// fault of its script (cycled) and each grant notification the next
// entry of its lose list. Close always reaches inner: it frees the
// node's resources, not a network call.
type faultyLink struct {
	inner fairqueue.Store
	node  int
	logf  func(format string, args ...any)

	mu     sync.Mutex
	state  linkState
	script []fault
	calls  int
	lose   []bool
	grants int
	h      fairqueue.Handler
}

func (l *faultyLink) isLossy() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.state == linkLossy
}

func (l *faultyLink) makeLossy(script []fault, lose []bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.state != linkDead {
		l.state, l.script, l.lose, l.calls, l.grants = linkLossy, script, lose, 0, 0
	}
}

func (l *faultyLink) makeHealthy() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.state != linkDead {
		l.state = linkHealthy
	}
}

func (l *faultyLink) kill() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.state = linkDead
}

func (l *faultyLink) next(op string) fault {
	l.mu.Lock()
	f, state := faultPass, l.state
	switch state {
	case linkDead:
		f = faultFail
	case linkLossy:
		f = l.script[l.calls%len(l.script)]
		l.calls++
	}
	l.mu.Unlock()
	if state == linkLossy && f != faultPass {
		l.logf("link of node %d: %s %s", l.node, op, f)
	}
	return f
}

// through runs call as the link's next fault says.
func through[R any](l *faultyLink, op string, call func() (R, error)) (R, error) {
	var zero R
	switch l.next(op) {
	case faultTwice:
		_, _ = call()
	case faultLost:
		if _, err := call(); err != nil {
			return zero, err
		}
		return zero, fmt.Errorf("%s: %w", op, errReplyLost)
	case faultFail:
		return zero, fmt.Errorf("%s: %w", op, errUnreachable)
	}
	return call()
}

func noValue(f func() error) func() (struct{}, error) {
	return func() (struct{}, error) { return struct{}{}, f() }
}

// Open implements fairqueue.Store. A failed subscription is closed by its
// store, so Open either runs or fails: it is never run twice or without
// its reply.
func (l *faultyLink) Open(ctx context.Context, node string, h fairqueue.Handler) error {
	l.mu.Lock()
	l.h = h
	l.mu.Unlock()
	if f := l.next("open"); f == faultFail || f == faultLost {
		return fmt.Errorf("open: %w", errUnreachable)
	}
	return l.inner.Open(ctx, node, l)
}

// Acquire implements fairqueue.Store.
func (l *faultyLink) Acquire(ctx context.Context, t fairqueue.TicketArgs) (fairqueue.AcquireResult, error) {
	return through(l, "acquire "+t.ID, func() (fairqueue.AcquireResult, error) { return l.inner.Acquire(ctx, t) })
}

// Release implements fairqueue.Store.
func (l *faultyLink) Release(ctx context.Context, t fairqueue.TicketArgs) error {
	_, err := through(l, "release "+t.ID, noValue(func() error { return l.inner.Release(ctx, t) }))
	return err
}

// Cancel implements fairqueue.Store.
func (l *faultyLink) Cancel(ctx context.Context, t fairqueue.TicketArgs) error {
	_, err := through(l, "cancel "+t.ID, noValue(func() error { return l.inner.Cancel(ctx, t) }))
	return err
}

// Requeue implements fairqueue.Store.
func (l *faultyLink) Requeue(ctx context.Context, t fairqueue.RequeueArgs) (fairqueue.AcquireResult, error) {
	return through(l, "requeue "+t.Old+" as "+t.ID, func() (fairqueue.AcquireResult, error) { return l.inner.Requeue(ctx, t) })
}

// Transfer implements fairqueue.Transferrer when the store does (the
// local handoff; a store without it never names a head, see Head).
func (l *faultyLink) Transfer(ctx context.Context, t fairqueue.TicketArgs, to string) error {
	tr, ok := l.inner.(fairqueue.Transferrer)
	if !ok {
		return errors.New("storetest: the store does not transfer")
	}
	_, err := through(l, "transfer "+t.ID+" to "+to, noValue(func() error { return tr.Transfer(ctx, t, to) }))
	return err
}

// Heartbeat implements fairqueue.Store.
func (l *faultyLink) Heartbeat(ctx context.Context, hb fairqueue.HeartbeatArgs) (fairqueue.HeartbeatResult, error) {
	return through(l, "heartbeat", func() (fairqueue.HeartbeatResult, error) { return l.inner.Heartbeat(ctx, hb) })
}

// Reconcile implements fairqueue.Store.
func (l *faultyLink) Reconcile(ctx context.Context, node string, limits fairqueue.Limits) (fairqueue.ReconcileResult, error) {
	return through(l, "reconcile", func() (fairqueue.ReconcileResult, error) { return l.inner.Reconcile(ctx, node, limits) })
}

// Leave implements fairqueue.Store.
func (l *faultyLink) Leave(ctx context.Context, node string, limits fairqueue.Limits) error {
	_, err := through(l, "leave", noValue(func() error { return l.inner.Leave(ctx, node, limits) }))
	return err
}

// Close implements fairqueue.Store.
func (l *faultyLink) Close() error { return l.inner.Close() }

// Granted implements fairqueue.Handler: a lossy link loses the
// notifications its lose list says, a dead one all of them. Grants a
// store returns in a call's reply pass here too (the Redis store hands
// them to the Handler): losing one is found by reconcile as well.
func (l *faultyLink) Granted(grants ...fairqueue.Grant) {
	keep := make([]fairqueue.Grant, 0, len(grants))
	var lost []string
	l.mu.Lock()
	h, state := l.h, l.state
	for _, g := range grants {
		switch {
		case state == linkDead:
		case state == linkLossy && l.lose[l.grants%len(l.lose)]:
			l.grants++
			lost = append(lost, g.Ticket)
		default:
			if state == linkLossy {
				l.grants++
			}
			keep = append(keep, g)
		}
	}
	l.mu.Unlock()
	if len(lost) > 0 {
		l.logf("link of node %d: grant notification lost: %v", l.node, lost)
	}
	if len(keep) > 0 && h != nil {
		h.Granted(keep...)
	}
}

// Head implements fairqueue.HeadHandler: a lossy link loses it when it
// loses the next grant notification, a dead one always.
func (l *faultyLink) Head(ticket string, permits int) {
	l.mu.Lock()
	hh, _ := l.h.(fairqueue.HeadHandler)
	lose := l.state == linkDead || (l.state == linkLossy && len(l.lose) > 0 && l.lose[l.grants%len(l.lose)])
	l.mu.Unlock()
	if lose {
		l.logf("link of node %d: head %q lost", l.node, ticket)
		return
	}
	if hh != nil {
		hh.Head(ticket, permits)
	}
}

// Resynced implements fairqueue.Handler.
func (l *faultyLink) Resynced() {
	l.mu.Lock()
	h, dead := l.h, l.state == linkDead
	l.mu.Unlock()
	if h != nil && !dead {
		h.Resynced()
	}
}

var (
	_ fairqueue.Store       = (*faultyLink)(nil)
	_ fairqueue.Handler     = (*faultyLink)(nil)
	_ fairqueue.Transferrer = (*faultyLink)(nil)
	_ fairqueue.HeadHandler = (*faultyLink)(nil)
)
