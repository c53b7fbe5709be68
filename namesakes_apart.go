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
// apart: either is retired but kept in its store (stays), or a config
// load used them side by side and either has a live namesake besides
// the other that it is not apart from (the queue that took its place:
// in another store, or in its own, where a reload brought it back).
// Under r.mu.
func (r *engineRegistry) keptApart(a, b *engine) bool {
	if a.stays() || b.stays() {
		return true
	}
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

// A queue named from the request is retired at a reload that keeps it in
// its store as soon as the old handler's reference goes (the new
// config's handler takes one at its first request): it did not move, and
// while its old requests run, a namesake in another store (another
// site's) must neither count them nor take its waiters.

// servingIn lists the handlers of loaded configs that name queues from
// the request in store data and serve name.
func (t *templateRegistry) servingIn(data, name string) []*Handler {
	t.Lock()
	var all []*Handler
	for k, hs := range t.m {
		if k.data != data {
			continue
		}
		for x := range hs {
			all = append(all, x)
		}
	}
	t.Unlock()
	var out []*Handler
	for _, x := range all { // liveness takes x.mu: read with t unlocked
		if x.loaded() && x.serves(name) {
			out = append(out, x)
		}
	}
	return out
}

// stays reports whether e, retired, is kept in its store by a handler of
// a config still loaded (stayWith). It takes no lock.
func (e *engine) stays() bool {
	if !e.retiredFlag.Load() {
		return false
	}
	for _, x := range e.stayWith {
		select {
		case <-x.load:
		default:
			return true
		}
	}
	return false
}
