package storetest

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"pgregory.net/rapid"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
)

// The invariants of the model-based test (model.go): its windows, the
// reference model, and the checks made after every action.

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
	m.heldTokens += r.permit.Tokens()
	if m.held >= m.permits {
		m.freeSince = time.Time{}
	}
	// The grant may have taken the room a waiter needed (its upstream's,
	// its tenant's): the checks see it again before counting.
	m.roomSince = time.Time{}
	for _, o := range m.reqs {
		if o.tenant == r.tenant {
			o.eligibleSince = time.Time{}
		}
	}
}

func (m *model) unhold(r *request, now time.Time) {
	if !r.holding {
		return
	}
	r.holding = false
	m.held--
	m.heldTokens -= r.permit.Tokens()
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
		permits, kv := m.permitBound(now)
		if m.healthy(now) && m.held > permits {
			m.violate("invariant 1 (permits): acquire #%d on node %d granted %s while callers hold %d permits of %d, "+
				"in a healthy period (last heal %s, last restart %s, last reload %s); holders %v", r.no, r.node.i, p.Ticket(),
				m.held, permits, m.ago(now, m.lastHeal), m.ago(now, m.lastRestart), m.ago(now, m.lastReload), m.holders())
		}
		// A request queued weighing more than a reload then left (its
		// weight clamped to the old capacity) runs alone, as one clamped
		// to the new capacity does.
		if kv > 0 && m.healthy(now) && m.heldTokens-p.Tokens()+min(p.Tokens(), kv) > kv {
			m.violate("invariant 1 (tokens): acquire #%d on node %d granted %s (%d tokens) while callers hold %d tokens of %d, "+
				"in a healthy period (last heal %s, last restart %s, last reload %s); holders %v", r.no, r.node.i, p.Ticket(),
				p.Tokens(), m.heldTokens, kv, m.ago(now, m.lastHeal), m.ago(now, m.lastRestart), m.ago(now, m.lastReload),
				m.holders())
		}
		if m.healthy(now) {
			m.checkShares(r, now)
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
	for _, r := range m.reqs {
		switch {
		case !m.eligible(r):
			r.eligibleSince = time.Time{}
		case r.eligibleSince.IsZero():
			r.eligibleSince = now
		}
	}
	from, ok := m.healthySince(now)
	if !ok || m.held >= m.permits || !m.room(now) {
		return
	}
	from = latest(latest(from, m.freeSince), m.roomSince)
	for _, r := range m.reqs {
		if !m.eligible(r) || r.reported {
			continue
		}
		if w := now.Sub(latest(latest(from, r.start), r.eligibleSince)); w > progressBound {
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

// room reports whether every eligible waiter (see eligible) could be
// served now: with tokens, the weights held leave room for it, and with
// a pool, an upstream in dispatch has a free permit and room for it
// (then the one dispatch serves first fits, whichever it is). It keeps
// roomSince: the first check that saw it so. Called with m.mu held.
func (m *model) room(now time.Time) bool {
	need, waiters := 0, 0
	for _, r := range m.reqs {
		if m.eligible(r) {
			waiters++
			if m.kv > 0 {
				need = max(need, min(r.tokens, m.tokenBound()))
			}
		}
	}
	if waiters == 0 || (m.kv > 0 && m.heldTokens+need > m.kv) || !m.placeable(need, now) {
		m.roomSince = time.Time{}
		return false
	}
	if m.roomSince.IsZero() {
		m.roomSince = now
	}
	return true
}
