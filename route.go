package caddyfairqueue

import (
	"sync/atomic"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
)

// A reload that turns a queue's pool on or off changes what a grant is:
// with a pool it names the upstream that reverse_proxy must take
// (dynamic fair_queue), without one it names none and the route's own
// upstream serves it. The engine, shared across the reload, takes the
// new config's settings at once, while the old config's waiters still
// run through their own route: granted on the new shape, they would be
// sent where the grant does not count them (a static upstream for a
// pool grant), or nowhere (dynamic fair_queue without an upstream). Such
// a waiter is served by the route of the config in force that fits its
// grant: the engine keeps, for each shape, the next handler of the
// live handler that last applied its settings to it.
//
// A reload that points a static reverse_proxy at another upstream (A to
// B) changes nothing of the grant's shape, but a waiter of the old config
// granted under the new config's permits would run on A beyond A's own.
// It goes through the new config's route instead, to B, where the grant
// was made under no more permits than B's (Permit.GrantedUnder): no more
// holders than B's permits ran when it was made. A grant made under more
// (the old config's higher permits, by another instance not yet reloaded
// or a call on its way) stays on the old route, the one those permits
// were set for; and where it cannot be told (a grant of unknown permits,
// two handlers of the new config naming the queue, tokens or a learned
// capacity) too.

// route is a handler's place in a config: what follows it. Where a
// reload's cleanup handed a handler's settings on before it served
// (reloadapply.go), the route of the handler cleaned up stands for its
// own: of is then the handler whose next it is.
type route struct {
	h    *Handler
	next caddyhttp.Handler
	of   *Handler
}

// engineRoutes are the routes of the live handlers of an engine, one for
// each shape of grant.
type engineRoutes struct {
	pooled, plain atomic.Pointer[route]
	// failed is the plain route of the last handler whose settings were
	// in force until its cleanup handed the queue back to an older
	// config's (a config that failed to load once it had served): a
	// grant made under its settings may reach its request only then.
	failed atomic.Pointer[route]
}

// pooled reports whether the handler's grants name an upstream.
func (h *Handler) pooled() bool { return len(h.Upstreams) > 0 }

// live reports whether the handler belongs to the config in force (its
// Cleanup, which a reload runs, has not).
func (h *Handler) live() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return !h.cleaned
}

// record notes that h, with next after it, serves the engine's queue:
// called at h's first use of the engine, before h's settings apply.
func (rs *engineRoutes) record(h *Handler, next caddyhttp.Handler) {
	rs.restore(&route{h: h, next: next, of: h})
	rs.failed.Store(nil) // a config since serves: grants are made under its settings
}

// restore records r again for r.h, if live: a failed config's handler
// that served recorded its own since.
func (rs *engineRoutes) restore(r *route) {
	if r.h.live() {
		rs.slot(r.h.pooled()).Store(r)
	}
}

// slot holds the route of the shape.
func (rs *engineRoutes) slot(pooled bool) *atomic.Pointer[route] {
	if pooled {
		return &rs.pooled
	}
	return &rs.plain
}

// known reports whether a live handler has recorded its route.
func (rs *engineRoutes) known() bool {
	return rs.plain.Load() != nil || rs.pooled.Load() != nil
}

// get is the route of the shape, nil if none; live: its handler's config
// is in force.
func (rs *engineRoutes) get(pooled bool) (r *route, live bool) {
	if r = rs.slot(pooled).Load(); r == nil {
		return nil, false
	}
	return r, r.h.live()
}

// forGrant returns the next handler that serves permit p of e's queue,
// granted to a request of h: h's own, unless the grant's shape is not
// h's (a reload changed the queue's pool while the request waited); then
// the route of that shape of a live handler of the queue, here or in a
// namesake (another engine of the name: a retired engine's waiters are
// granted by the store on the shape of the config in force), else the
// one of a handler replaced since. A plain grant of a request of a
// replaced config may take the route of the config in force (see
// staticInForce).
// dial is the upstream a plain grant goes to on h's own route where h
// has a pool and no route without one fits the grant: an instance
// without the pool made it (a rolling change that adds the pool), and
// the store counts such a grant on every upstream of the pool, so it
// runs on the first; "" otherwise (the route chooses).
func (e *engine) forGrant(h *Handler, p *fairqueue.Permit, next caddyhttp.Handler) (_ caddyhttp.Handler, dial string) {
	pooled := p.Upstream() != ""
	if p.FailOpen() {
		return next, ""
	}
	if pooled == h.pooled() {
		if !pooled {
			if r := e.staticInForce(h, p); r != nil {
				return r.next, ""
			}
		}
		return next, ""
	}
	r, live := e.routes.get(pooled)
	if live {
		return r.next, ""
	}
	if lr := namesakes.route(e.name, pooled); lr != nil {
		return lr.next, ""
	}
	if r != nil {
		// The route of a config replaced since (its handlers still serve
		// their own requests): it fits the grant, the handler's own does
		// not.
		return r.next, ""
	}
	if !pooled {
		return next, h.Upstreams[0].Dial
	}
	return next, ""
}

// staticInForce is the route of the config in force for plain grant p of
// a request of h, whose config was replaced since (see above; also
// while h's config is not yet cleaned up, once the later config's
// handler has served the queue), or of the
// config replaced since whose settings the queue still has (the config
// in force has not served it yet: the grant was made under them); nil
// where h's own route serves it: h's config is in force, or no handler
// of a later config has served (the queue's settings are still h's
// config's), or two of its handlers name the queue (two routes share
// it: which replaced h's is unknown), or one names it from the request,
// or either config counts tokens or learns its capacity, or the grant
// was made under more permits than that route's (or unknown ones).
func (e *engine) staticInForce(h *Handler, p *fairqueue.Permit) *route {
	r, live := e.routes.get(false)
	if h.live() {
		// h's config is in force, unless a later config's handler serves
		// the queue too: Caddy starts the new config before it stops the
		// old one, and the new config's first request applies its
		// settings, under which h's waiters are granted meanwhile.
		// Another handler of h's own config (another route that shares
		// the queue) replaced nothing.
		if r == nil || !live || r.h.gen <= h.gen || r.h.load == h.load {
			// A grant made under more permits than h's, those of a later
			// config that failed to load once it had served, reaching h's
			// request as that config is cleaned up: that config's route.
			f := e.routes.failed.Load()
			if f == nil || f.h.gen <= h.gen || f.h.load == h.load || p.GrantedUnder() <= h.Permits {
				return nil
			}
			r = f
		}
	} else if !live {
		if r = namesakes.route(e.name, false); r == nil {
			// The route of a config cleaned up since whose settings the
			// queue still has (the config in force has not served it):
			// the grant was made under them, for that route.
			if r = namesakes.settingsRoute(e); r == nil {
				// The queue has a pool's settings now (a later config's):
				// a plain grant was made under the plain settings before
				// them, whose handler recorded its route last, on e or on
				// a queue of its store whose settings e took (its grant
				// may reach the request after the pool's config served).
				// h's own route may be one that no config since lets run
				// anything.
				if len(e.q.Config().Upstreams) == 0 {
					return nil
				}
				if r = namesakes.lastPlainRoute(e); r == nil {
					return nil
				}
			}
		}
	}
	for _, x := range []*Handler{h, r.h} {
		if x.KVTokens > 0 || x.Adaptive != nil || x.pooled() {
			return nil
		}
	}
	if g := p.GrantedUnder(); g <= 0 || g > r.h.Permits || !r.h.soleClaimant() {
		return nil
	}
	return r
}
