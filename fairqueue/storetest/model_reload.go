package storetest

import (
	"time"

	"pgregory.net/rapid"
)

// Reloads in the model-based test (model.go): every live node is given
// new permits and, where the cluster counts tokens, a new kv_tokens, one
// node after the other (a rolling reload: for a drawn while the nodes
// disagree). A grant made while they disagree, or reloadWindow after,
// may count the larger of the old and the new settings (a store call
// sent under the old ones may still grant); any later grant counts the
// new ones, the permits granted before included (invariant 1).

// reloadWindow is how long after the last node took the new settings a
// grant may still be made under the old ones: a store call sent before
// it, and its grant's message (links are healthy there: a lossy one
// opens its own window).
const reloadWindow = modelPoll + schedSlack

// reload reconfigures every live node with new permits (not with a
// pool: its upstreams' permits are its permits) and, with tokens, a new
// kv_tokens.
func (m *model) reload(rt *rapid.T) {
	permits := rapid.IntRange(1, 3).Draw(rt, "reload_permits")
	kv := m.kv
	if kv > 0 {
		kv = rapid.IntRange(4, 12).Draw(rt, "reload_kv_tokens")
	}
	gap := time.Duration(rapid.IntRange(0, 200).Draw(rt, "reload_gap_ms")) * time.Millisecond
	m.mu.Lock()
	old, oldKV := m.permits, m.kv
	m.prevPermits, m.prevKV = max(old, permits), max(oldKV, kv)
	m.permits, m.kv = permits, kv
	m.reloading = true
	m.mu.Unlock()
	m.logf("reload: permits %d -> %d, kv_tokens %d -> %d, %s between nodes", old, permits, oldKV, kv, gap)
	for i, n := range m.nodes {
		if n.crashed {
			continue
		}
		if i > 0 {
			time.Sleep(gap)
		}
		cfg := n.q.Config()
		cfg.Permits, cfg.KVTokens = permits, kv
		if err := n.q.Reconfigure(cfg); err != nil {
			m.fatalf("reconfigure node %d: %v", n.i, err)
		}
		m.logf("node %d reloaded", n.i)
	}
	now := time.Now()
	m.mu.Lock()
	m.reloading = false
	m.lastReload = now
	switch {
	case m.held >= m.permits:
		m.freeSince = time.Time{}
	case m.freeSince.IsZero():
		m.freeSince = now
	}
	m.roomSince = time.Time{}
	m.mu.Unlock()
}

// permitBound is the permits and tokens a grant made now may leave held
// (invariant 1): the larger settings while a reload is in its window.
// Called with m.mu held.
func (m *model) permitBound(now time.Time) (permits, kv int) {
	if m.reloading || since(now, m.lastReload) < reloadWindow {
		return max(m.permits, m.prevPermits), max(m.kv, m.prevKV)
	}
	return m.permits, m.kv
}
