package storetest

import (
	"math"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
)

// Invariant 6 of the model-based test (model.go): fairness. With fair
// tenants, equal weights and costs, no tenant cap and no tokens, the
// store serves the ready flow with the least usage counter; a flow that
// becomes active starts at the least counter of the ready flows, or at
// the debt it left with (at most one cost above V). So while a request
// r waits, another flow in r's band or below gets at most a couple of
// grants more than r's own flow does, and one a band higher
// PriorityFactor times that: a tenant is never starved while others are
// served, nor a band by the bands above it. The check counts, for each
// request granted in a healthy era, the grants made before it (by the
// store's grant numbers) to requests of other tenants that arrived after
// it (by the store's arrival numbers), a grant k bands higher as
// 1/PriorityFactor^k of one, and bounds them by overtakeBound per such
// flow, plus one per grant of its own flow made meanwhile. (A cap or
// tokens let flows pass a blocked one by design.) A flow that held a
// permit when r started is not bounded: it keeps its counter, not
// lifted, while others are charged, and passes r as many times as its
// counter is behind (docs/design.md, "Fairness";
// ATenantWithARequestRunningKeepsItsCounterAndPassesThatManyGrants).

// overtakeBound is how many grants one other flow may get ahead of a
// waiting request beyond one per grant of the request's own flow: the
// spread of usage counters among ready flows (one cost) and a debt (one
// cost), and one for the tie.
const overtakeBound = 3

// checkFairness checks invariant 6 after every Acquire answered.
func (m *model) checkFairness() {
	s := m.shares
	if !s.fair || s.inCap > 0 || m.kv > 0 {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	type grant struct {
		r        *request
		seq, gno int64
	}
	var gs []grant
	for _, r := range m.reqs {
		if r.permit != nil && !r.abandoned {
			if seq, gno := r.permit.Seq(), r.permit.GrantNo(); seq > 0 && gno > 0 {
				gs = append(gs, grant{r, seq, gno})
			}
		}
	}
	for _, a := range gs {
		if !a.r.orderly {
			continue
		}
		own, over := 0, 0.0
		flows := map[int]bool{}
		for _, b := range gs {
			if b.r.epoch != a.r.epoch || b.gno >= a.gno {
				continue
			}
			switch {
			case b.r.tenant == a.r.tenant && b.r.band == a.r.band && b.seq < a.seq:
				own++
			case b.r.tenant != a.r.tenant && b.seq > a.seq && b.r.orderly && b.r.era == a.r.era &&
				!a.r.running[m.flowKey(b.r)]:
				// A grant of a higher band counts its share of a cost.
				over += 1 / math.Pow(fairqueue.DefaultPriorityFactor, float64(max(b.r.band-a.r.band, 0)))
				flows[m.flowKey(b.r)] = true
			}
		}
		if bound := len(flows) * (own + overtakeBound); over > float64(bound) {
			m.violate("invariant 6 (fairness): acquire #%d (tenant %d, band %d, seq %d) was granted as %d after %.3g grants to "+
				"%d other tenants' flows that arrived after it (bound %d; %d grants to its own flow meanwhile)",
				a.r.no, a.r.tenant, a.r.band, a.seq, a.gno, over, len(flows), bound, own)
		}
	}
}

// flowKey names r's flow (its tenant in its band) in the fairness check.
func (m *model) flowKey(r *request) int {
	return r.tenant*(m.shares.bands+1) + r.band
}

// runningFlows are the flows of the requests holding a permit, as the
// model saw them answered; the caller holds m.mu.
func (m *model) runningFlows() map[int]bool {
	var fs map[int]bool
	for _, r := range m.reqs {
		if r.holding {
			if fs == nil {
				fs = map[int]bool{}
			}
			fs[m.flowKey(r)] = true
		}
	}
	return fs
}
