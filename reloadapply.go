package caddyfairqueue

import "sync"

// A reload that succeeds cleans up the old config's handlers once the
// new config is in force. A handler of the new config applies its
// settings to a shared queue with its first request, recording its
// route first: the old config's waiters granted under the new settings
// may need that route (route.go). A backlog that no new request joins
// (a burst that has ended) would drain under the old settings until a
// request came. So when the handler whose settings are in force is
// cleaned up and no handler of the config in force has served the
// queue, the newest handler of that config that holds the queue (a
// static name takes its reference at provisioning), or for a queue named
// from the request that config's one handler that names queues alike,
// applies its settings at once, where the old configs' waiters need no
// route of the new config to stay within their upstream's permits
// (handsOnSafely), or where the route of the handler cleaned up, the
// last to serve the queue, stands for its own: for more permits where
// what follows both is the same (takesOverRoute, routechain.go), for no
// more in any case (standIn). Otherwise its settings apply with its
// first request, as before.

// handOn gives e, whose settings in force were those of h (cleaned up)
// and which no handler of the config in force has served, the settings
// of the newest handler of that config that holds it, if that is safe;
// for a queue h named from the request, where none holds it, those of
// the handler of that config that names queues as h did. fresh: e has
// had no request since h opened it (a request still on its way in
// through h would run on h's route).
func (e *engine) handOn(h *Handler, fresh bool) {
	y := e.appliers.newestHolder()
	if y == nil && h.dynamic {
		y = templates.successor(e, h)
	}
	if y == nil {
		return
	}
	switch {
	case fresh && followedAlike(h, y):
	case e.takesOverRoute(h, y):
	case e.handsOnSafely(h, y):
		if r := e.routes.plain.Load(); r != nil && r.h == h && !y.pooled() && y.Permits <= h.Permits {
			e.standIn(r, y)
		}
	default:
		return
	}
	if r := e.routes.plain.Load(); r != nil && r.h == y && !y.dynamic {
		// A failed reload that serves records its own route and applies
		// its settings: once it is gone, y's apply again with this route
		// (restore). y holds e (a static name): its cleanup drops it
		// from the appliers.
		e.appliers.handedOn(r)
	}
	y.applySettings(e)
}

// templates are the provisioned handlers that name their queue from the
// request, by data set and Name (with its placeholders): a handler of
// the config in force that names queues as a cleaned-up one did would
// serve the queues it leaves.
var templates = &templateRegistry{m: make(map[templateKey]map[*Handler]bool)}

// templateRegistry is the type of templates.
type templateRegistry struct {
	sync.Mutex
	m map[templateKey]map[*Handler]bool
}

type templateKey struct{ data, name string }

// addTemplate registers h, whose Name has placeholders (Provision).
func (h *Handler) addTemplate() {
	k := templateKey{h.backend.dataID(), h.Name}
	templates.Lock()
	defer templates.Unlock()
	if templates.m[k] == nil {
		templates.m[k] = make(map[*Handler]bool)
	}
	templates.m[k][h] = true
}

// dropTemplate takes h out of templates (Cleanup).
func (h *Handler) dropTemplate() {
	if !h.dynamic || h.backend == nil {
		return
	}
	k := templateKey{h.backend.dataID(), h.Name}
	templates.Lock()
	defer templates.Unlock()
	delete(templates.m[k], h)
	if len(templates.m[k]) == 0 {
		delete(templates.m, k)
	}
}

// successor is the handler whose config is loaded, newest first, that
// names queues as h did and serves e's; nil if none, or if two of its
// config do (which would serve e's queue is the request's choice).
func (t *templateRegistry) successor(e *engine, h *Handler) *Handler {
	t.Lock()
	var all []*Handler
	for x := range t.m[templateKey{e.data, h.Name}] {
		all = append(all, x)
	}
	t.Unlock()
	var newest *Handler
	ambiguous := false
	for _, x := range all { // liveness takes x.mu: read with t unlocked
		if x == h || !x.loaded() || !x.serves(e.name) {
			continue
		}
		switch {
		case newest == nil || x.gen > newest.gen && x.load != newest.load:
			newest, ambiguous = x, false
		case x.load == newest.load:
			ambiguous = true
		}
	}
	if ambiguous {
		return nil
	}
	return newest
}

// handsOnSafely reports whether y's settings may apply to a queue whose
// waiters h, the handler whose settings were in force, leaves, before y
// has recorded its route: whether a waiter of an old config, granted
// under y's settings, is served where the grant counts it by its own
// route. That holds when the grant names its upstream (a pool on both
// sides), when it would take its own route even with y's recorded (see
// staticInForce: tokens or a learned capacity), when y's permits are no
// more than h's (the old routes run no more at once than they did), and
// where several handlers of y's config name the queue, or one names it
// from the request (the old waiters keep their own routes then too),
// when what follows y is alike to what follows h and every handler whose
// requests wait in the queue here (those of a config before h's, or of
// another route of h's config, run on their own route's upstream, which
// h's chain does not tell). Where y's permits are more, see also
// takesOverRoute.
func (e *engine) handsOnSafely(h, y *Handler) bool {
	if fits, settled := grantShapeFits(h, y); settled {
		return fits
	}
	switch {
	case y.Permits <= h.Permits:
		return true
	case !y.soleClaimant():
		// The old waiters keep their own route even once y serves: more
		// permits only where each reaches the same upstreams as y's.
		return followedAlike(h, y) && e.waitersFollowedAlike(y)
	}
	return false
}

// grantsFitRouteOf reports whether a grant of e's settings runs where
// it is counted on the route of h, a handler cleaned up since whose
// request Handler.use sent on to e, the live queue of its name in
// another store, before any handler of the config in force has served e
// (awaitRoute): e's settings are still those of y, the one handler of
// that config that names the queue, which opened e at its provisioning,
// and a grant of them would take h's route alike once y serves: the
// grant names its upstream (a pool on both sides), or a plain grant
// takes its own route then too (tokens, a learned capacity: see
// staticInForce), or what follows h is alike to what follows y (the
// same upstreams). Otherwise the request waits for y's route.
func (e *engine) grantsFitRouteOf(h *Handler) bool {
	y := e.appliers.newestHolder()
	if y == nil || !y.soleClaimant() {
		return false
	}
	if gen := e.settingsOf(); gen != 0 && gen != y.gen {
		return false // another handler's settings (one opened e before y)
	}
	if fits, settled := grantShapeFits(h, y); settled {
		return fits
	}
	return followedAlike(h, y)
}

// grantShapeFits settles, where the grant's shape alone decides it,
// whether a grant of y's settings fits h's route: not where one has a
// pool and the other not (a grant of the other shape needs y's route);
// yes where both have one (the grant names its upstream), or where
// either counts tokens or learns its capacity (a plain grant then takes
// its own route: see staticInForce). settled is false where the
// upstreams after each handler decide.
func grantShapeFits(h, y *Handler) (fits, settled bool) {
	switch {
	case h.pooled() != y.pooled():
		return false, true
	case h.pooled():
		return true, true
	case h.KVTokens > 0 || h.Adaptive != nil || y.KVTokens > 0 || y.Adaptive != nil:
		return true, true
	}
	return false, false
}

// waitersFollowedAlike reports whether what follows each handler whose
// requests wait in e's queue here, or in a retired queue of its store
// that takes its settings (adopt), is alike to what follows y.
func (e *engine) waitersFollowedAlike(y *Handler) bool {
	for _, o := range append([]*engine{e}, namesakes.sameStore(e)...) {
		for _, x := range o.waits.handlers() {
			if x == nil || !followedAlike(x, y) {
				return false
			}
		}
	}
	return true
}

// followedAlike reports whether the handlers after a and after b, up to
// reverse_proxy, are alike (routechain.go).
func followedAlike(a, b *Handler) bool {
	ca, ok := chainAfter(a)
	if !ok {
		return false
	}
	cb, ok := chainAfter(b)
	return ok && sameChain(ca, cb)
}

// takesOverRoute records, for y's settings, a route that the old
// configs' waiters take as they would y's own once it serves
// (staticInForce): the one recorded for h, which served the queue last
// or stood for the handler that did (standIn), where the handlers after
// y reach the same upstreams as those after the handler whose route it
// is. Their own routes may not: a waiter of a config before h's, or of
// another route of h's config, runs on its own route's upstream, which
// must not run y's permits. Where several handlers of y's config name
// the queue, or one names it from the request, the old waiters keep
// their own routes even once y serves (staticInForce): no route takes
// over for them (see handsOnSafely). It reports whether it recorded the
// route; y's first request records its own.
func (e *engine) takesOverRoute(h, y *Handler) bool {
	r := e.routes.plain.Load()
	if r == nil || r.h != h || h.pooled() || y.pooled() || !y.soleClaimant() || !followedAlike(r.of, y) {
		return false
	}
	return e.standIn(r, y)
}

// standIn records r, the route recorded for the handler whose settings
// were in force, as the one the old configs' waiters take under y's
// settings until y serves: a grant under them fits it (y's permits are
// no more, or what follows is alike: takesOverRoute). Without it they
// would take their own routes, whose upstreams may have had fewer
// permits. It reports whether it recorded r for y: where y or another
// handler recorded its route meanwhile, that one stands.
func (e *engine) standIn(r *route, y *Handler) bool {
	return y.live() && e.routes.plain.CompareAndSwap(r, &route{h: y, next: r.next, of: r.of})
}
