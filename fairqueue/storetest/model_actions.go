package storetest

import (
	"context"
	"flag"
	"strconv"
	"time"

	"pgregory.net/rapid"
)

// The actions rapid draws in the model-based test (model.go).

// acquire starts 1-3 Acquires on a node, each in its own goroutine with
// its own context.
func (m *model) acquire(rt *rapid.T) {
	n := m.nodes[rapid.IntRange(0, len(m.nodes)-1).Draw(rt, "node")]
	if n.crashed {
		rt.Skip("node crashed")
	}
	for range rapid.IntRange(1, 3).Draw(rt, "count") {
		w := 0
		if m.kv > 0 {
			w = rapid.IntRange(1, m.kv+2).Draw(rt, "tokens") // above kv_tokens: clamped
		}
		tenant, band := m.shares.request(rt)
		m.startAcquire(n, false, w, tenant, band)
	}
}

func (m *model) startAcquire(n *modelNode, probe bool, tokens, tenant, band int) {
	ctx, cancel := context.WithCancel(context.Background())
	m.mu.Lock()
	now := time.Now()
	r := &request{no: len(m.reqs) + 1, tokens: tokens, tenant: tenant, band: band, node: n, cancel: cancel, start: now, era: m.era,
		epoch: m.epoch, clean: m.healthy(now), probe: probe, running: m.runningFlows()}
	m.reqs = append(m.reqs, r)
	m.mu.Unlock()
	if probe {
		m.logf("acquire #%d on node %d (probe)", r.no, n.i)
	} else {
		m.logf("acquire #%d on node %d (tenant %d, band %d, %d tokens)", r.no, n.i, tenant, band, tokens)
	}
	m.wg.Add(1)
	go func() {
		defer m.wg.Done()
		defer cancel()
		p, err := n.q.Acquire(ctx, r.acquireRequest())
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
	m.epoch++
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
