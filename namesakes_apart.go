package caddyfairqueue

// Two sites of one config may name one queue in two stores: two queues,
// apart by the operator's choice, that do not count each other
// (sharesLoad). Once a reload moves one of them to a third store, the
// queue it leaves is retired and no config uses it any more: the live
// queues of its name in other stores would all count its requests, and
// take its waiters, as its successor's. Another site's queue is none:
// so each engine remembers the namesakes in other stores that a config
// load used beside it, and a pair of them stays apart once one retires,
// where the retired one has a namesake besides that it is not apart from
// (its successor). Where it has none (a reload that gave one site's
// queue to the other), the other counts it as before.

// markApart notes that load uses e beside each namesake of e in another
// store that it uses. Under r.mu.
func (r *engineRegistry) markApart(e *engine, load <-chan struct{}) {
	for _, o := range r.byName[e.name] {
		if o == e || o.data == e.data || o.loads[load] <= 0 {
			continue
		}
		if e.apart == nil {
			e.apart = make(map[*engine]bool)
		}
		if o.apart == nil {
			o.apart = make(map[*engine]bool)
		}
		e.apart[o], o.apart[e] = true, true
	}
}

// keptApart reports whether a and b, namesakes in other stores, stay
// apart: a config load used them side by side, and either has a live
// namesake besides the other that it is not apart from (the queue that
// took its place: in another store, or in its own, where a reload
// brought it back). Under r.mu.
func (r *engineRegistry) keptApart(a, b *engine) bool {
	if !a.apart[b] {
		return false
	}
	return r.hasSuccessor(a, b) || r.hasSuccessor(b, a)
}

// hasSuccessor reports whether e has a live namesake, neither e nor
// other, that it is not apart from; one in e's own store counts (a
// reload that moved e's queue away and back). Under r.mu.
func (r *engineRegistry) hasSuccessor(e, other *engine) bool {
	for _, x := range r.byName[e.name] {
		if x != other && x != e && !x.retiredFlag.Load() && !e.apart[x] {
			return true
		}
	}
	return false
}
