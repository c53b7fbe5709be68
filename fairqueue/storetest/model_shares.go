package storetest

import (
	"fmt"
	"time"

	"pgregory.net/rapid"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
)

// How the model-based test (model.go) shares the permits beyond FIFO:
// fair tenants in priority bands, max_in_flight_per_tenant, a pool of
// upstreams (each with its own permits and, with tokens, its own
// kv_tokens) and their cooldowns. rapid draws them per check; the
// checks below join invariant 1 (a grant made in a healthy period):
//
//   - cap: a tenant holds at most MaxInFlightPerTenant permits;
//   - pool: an upstream runs at most its permits and its kv_tokens, and a
//     request that arrived after a cooling release returned is not
//     granted on that upstream before the cooldown ends;
//
// and invariant 5 (progress) counts a waiter as stranded only when it
// could be served: its tenant under its cap, and an upstream in dispatch
// with a free permit and room for every such waiter. Invariant 6
// (fairness, model_fairness.go) bounds how often a tenant is overtaken.

// modelShares is what one check draws of the sharing configuration.
type modelShares struct {
	fair    bool
	tenants int // with fair: requests name one of them
	bands   int // with fair: requests draw a band below it
	inCap   int // MaxInFlightPerTenant; 0: no cap
	ups     []fairqueue.Upstream
	// the cooldowns asked (coolUpstream), oldest first
	cools []coolSpell
}

// coolSpell is one release that asked its upstream to cool: the store
// starts the cooldown between from and returned.
type coolSpell struct {
	up             string
	from, returned time.Time
	d              time.Duration
	healthy        bool // the link was healthy from start to end, and no restart came since
}

func (s modelShares) String() string {
	return fmt.Sprintf("fair %v (%d tenants, %d bands, tenant cap %d), upstreams %v", s.fair, s.tenants, s.bands, s.inCap, s.ups)
}

// drawShares draws the check's sharing configuration; a pool sets the
// permits to the sum of its upstreams'.
func (m *model) drawShares(rt *rapid.T) {
	s := &m.shares
	if s.fair = rapid.Bool().Draw(rt, "fair"); s.fair {
		s.tenants = rapid.IntRange(2, 3).Draw(rt, "tenants")
		s.bands = rapid.IntRange(1, 2).Draw(rt, "bands")
		s.inCap = rapid.SampledFrom([]int{0, 0, 1, 2}).Draw(rt, "tenant_cap")
	}
	if rapid.Bool().Draw(rt, "pool") {
		m.permits = 0
		for i := range rapid.IntRange(2, 3).Draw(rt, "upstreams") {
			u := fairqueue.Upstream{Dial: fmt.Sprintf("u%d:1", i), Permits: rapid.IntRange(1, 2).Draw(rt, "upstream_permits")}
			if m.kv > 0 {
				u.KVTokens = rapid.IntRange(2, m.kv).Draw(rt, "upstream_kv_tokens")
			}
			m.permits += u.Permits
			s.ups = append(s.ups, u)
		}
	}
}

// config adds the drawn sharing configuration to c.
func (s modelShares) config(c fairqueue.Config) fairqueue.Config {
	c.Fair, c.MaxInFlightPerTenant, c.Upstreams = s.fair, s.inCap, s.ups
	return c
}

// request draws the tenant and band of a new request.
func (s modelShares) request(rt *rapid.T) (tenant, band int) {
	if !s.fair {
		return 0, 0
	}
	return rapid.IntRange(0, s.tenants-1).Draw(rt, "tenant"), rapid.IntRange(0, s.bands-1).Draw(rt, "band")
}

func (r *request) acquireRequest() fairqueue.Request {
	return fairqueue.Request{Tokens: r.tokens, Tenant: fmt.Sprintf("tenant-%d", r.tenant), Priority: r.band}
}

// burst starts 3-6 Acquires of one tenant in one band on a node: a
// backlog that others must not starve, nor it them.
func (m *model) burst(rt *rapid.T) {
	n := m.nodes[rapid.IntRange(0, len(m.nodes)-1).Draw(rt, "node")]
	if n.crashed {
		rt.Skip("node crashed")
	}
	tenant, band := m.shares.request(rt)
	for range rapid.IntRange(3, 6).Draw(rt, "count") {
		w := 0
		if m.kv > 0 {
			w = rapid.IntRange(1, m.kv).Draw(rt, "tokens")
		}
		m.startAcquire(n, false, w, tenant, band)
	}
}

// tokenBound is the weight a request is counted with at most: the
// queue's kv_tokens, and the largest upstream's (fairqueue.Config.ClampTokens).
func (m *model) tokenBound() int {
	c := m.shares.config(fairqueue.Config{Permits: m.permits, KVTokens: m.kv})
	w, _ := c.ClampTokens(m.kv + 2)
	return w
}

// coolUpstream releases a held permit of a pool asking its upstream to
// cool for a drawn while.
func (m *model) coolUpstream(rt *rapid.T) {
	r := m.pick(rt, "holder on an upstream", func(r *request) bool { return r.holding && r.permit.Upstream() != "" })
	d := time.Duration(rapid.IntRange(100, 800).Draw(rt, "cool_ms")) * time.Millisecond
	m.mu.Lock()
	holding := r.holding
	m.unhold(r, time.Now())
	from := time.Now()
	healthy := m.healthy(from) && !r.node.link.isLossy()
	era := m.era
	m.mu.Unlock()
	if !holding {
		return
	}
	m.logf("release #%d on node %d (%s), cooling %s for %s", r.no, r.node.i, r.permit.Ticket(), r.permit.Upstream(), d)
	r.permit.Cool(d)
	r.permit.Release()
	m.mu.Lock()
	c := coolSpell{up: r.permit.Upstream(), from: from, returned: time.Now(), d: d, healthy: healthy && era == m.era}
	m.shares.cools = append(m.shares.cools, c)
	m.mu.Unlock()
}

// coolingUntil is when upstream up is surely in dispatch again, by the
// cooldowns asked (the zero time when none is known). Called with m.mu
// held.
func (m *model) coolingUntil(up string) time.Time {
	var end time.Time
	for _, c := range m.shares.cools {
		if c.up == up {
			end = latest(end, c.returned.Add(c.d))
		}
	}
	return end
}

// tenantHeld is the permits the callers of tenant hold. Called with m.mu
// held.
func (m *model) tenantHeld(tenant int) int {
	n := 0
	for _, r := range m.reqs {
		if r.holding && r.tenant == tenant {
			n++
		}
	}
	return n
}

// onUpstream is the permits held on up and their tokens. Called with
// m.mu held.
func (m *model) onUpstream(up string) (held, tokens int) {
	for _, r := range m.reqs {
		if r.holding && r.permit.Upstream() == up {
			held++
			tokens += r.permit.Tokens()
		}
	}
	return held, tokens
}

// checkShares checks a grant made in a healthy period against the cap
// and the pool (invariant 1). Called with m.mu held, r held.
func (m *model) checkShares(r *request, now time.Time) {
	s := &m.shares
	if s.inCap > 0 {
		if n := m.tenantHeld(r.tenant); n > s.inCap {
			m.violate("invariant 1 (tenant cap): acquire #%d on node %d granted %s while tenant %d holds %d permits of its cap %d, "+
				"in a healthy period; holders %v", r.no, r.node.i, r.permit.Ticket(), r.tenant, n, s.inCap, m.holders())
		}
	}
	if len(s.ups) == 0 {
		return
	}
	up := r.permit.Upstream()
	i := upstreamIndex(s.ups, up)
	if i < 0 {
		m.violate("invariant 1 (pool): acquire #%d on node %d granted %s on upstream %q, not one of the pool", r.no, r.node.i,
			r.permit.Ticket(), up)
		return
	}
	u := s.ups[i]
	if held, tokens := m.onUpstream(up); held > u.Permits || (u.KVTokens > 0 && tokens > u.KVTokens) {
		m.violate("invariant 1 (pool): acquire #%d on node %d granted %s on %s, which now runs %d permits of %d and %d tokens "+
			"of %d, in a healthy period; holders %v", r.no, r.node.i, r.permit.Ticket(), up, held, u.Permits, tokens, u.KVTokens,
			m.holders())
	}
	for _, c := range s.cools {
		if c.up == up && c.healthy && c.returned.After(m.lastRestart) && r.start.After(c.returned) && now.Before(c.from.Add(c.d)) {
			m.violate("invariant 1 (cooldown): acquire #%d on node %d, started after the release that cooled %s for %s returned "+
				"(%s), was granted there %s into the cooldown", r.no, r.node.i, up, c.d, m.ago(now, c.returned),
				now.Sub(c.from).Round(time.Millisecond))
		}
	}
}

func upstreamIndex(us []fairqueue.Upstream, dial string) int {
	for i, u := range us {
		if u.Dial == dial {
			return i
		}
	}
	return -1
}

// eligible reports whether r could be served now by the model's count:
// it waits, and its tenant is under its cap. Called with m.mu held.
func (m *model) eligible(r *request) bool {
	if r.done || r.cancelled || r.abandoned {
		return false
	}
	return m.shares.inCap == 0 || m.tenantHeld(r.tenant) < m.shares.inCap
}

// placeable reports whether a waiter weighing need fits an upstream of
// the pool that is in dispatch and has a free permit (true without a
// pool). Called with m.mu held.
func (m *model) placeable(need int, now time.Time) bool {
	if len(m.shares.ups) == 0 {
		return true
	}
	for _, u := range m.shares.ups {
		held, tokens := m.onUpstream(u.Dial)
		if held < u.Permits && !now.Before(m.coolingUntil(u.Dial).Add(schedSlack)) &&
			(m.kv == 0 || u.KVTokens == 0 || tokens+need <= u.KVTokens) {
			return true
		}
	}
	return false
}
