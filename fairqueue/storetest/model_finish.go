package storetest

import (
	"fmt"
	"runtime"
	"slices"
	"strings"
	"time"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
)

// The end of a check of the model-based test (model.go): teardown and
// the checks that need the run over.

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
	// subscription, a ticket stranded at the head would time out). With
	// tokens, one probe weighs the whole capacity.
	for _, n := range m.nodes {
		if !n.crashed {
			m.startAcquire(n, true, min(m.kv, 1), 0, 0)
			m.startAcquire(n, true, m.kv, max(m.shares.tenants-1, 0), max(m.shares.bands-1, 0))
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
	m.checkFairness()
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
// one healthy era were granted in the store's arrival order (with fair
// tenants, in each flow: a tenant's requests in one band). The store
// numbers arrivals (Seq) and grants (GrantNo), afresh after it lost its
// data: only requests of one era are compared. A grant found by
// reconcile before its notification has no number and is left out.
func (m *model) checkOrder() {
	m.mu.Lock()
	defer m.mu.Unlock()
	type grant struct {
		no, era, flow int
		seq, gno      int64
	}
	var gs []grant
	for _, r := range m.reqs {
		if r.orderly {
			if seq, gno := r.permit.Seq(), r.permit.GrantNo(); seq > 0 && gno > 0 {
				gs = append(gs, grant{r.no, r.era, r.tenant*(fairqueue.MaxPriority+1) + r.band, seq, gno})
			}
		}
	}
	slices.SortFunc(gs, func(a, b grant) int {
		if a.era != b.era {
			return a.era - b.era
		}
		if a.flow != b.flow {
			return a.flow - b.flow
		}
		return int(a.seq - b.seq)
	})
	for i := 1; i < len(gs); i++ {
		if a, b := gs[i-1], gs[i]; a.era == b.era && a.flow == b.flow && b.gno < a.gno {
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
