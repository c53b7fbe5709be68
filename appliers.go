package caddyfairqueue

import (
	"sync"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
)

// The settings in force on an engine are those of the newest handler, by
// provisioning number, that applied its own (engine.gen). A config whose
// load fails once its servers started (another app fails to start, and
// Caddy stops the servers it had started) may have served requests
// meanwhile: its handlers applied their settings, newer than those of the
// config in force, whose handlers applied theirs already and would not
// again. So an engine keeps the handlers that applied their settings and
// still hold a reference to it; when the handler whose settings are in
// force is cleaned up, the newest of them whose config is still loaded
// (its context not done: the config in force) applies its settings and
// records its route again; so too when that handler gives up its
// reference to a queue named from the request that went idle (queueIdle)
// before its config failed. A reload that succeeds cleans up the old
// config once the new one is in force, its context done: none of its
// handlers applies again. The new config's handlers of a static queue
// hold the engine from their provisioning without having applied their
// settings (holders); the newest of them applies its settings then,
// where that needs no route of its own (see reloadapply.go), and
// otherwise with its first request.

// appliers are the handlers that applied their settings to an engine,
// with the route recorded for them, while they hold a reference to it;
// and the holders: handlers that hold a reference from their
// provisioning and have not applied their settings yet, or applied them
// at a reload's cleanup with no route recorded for them.
type appliers struct {
	mu      sync.Mutex
	m       map[*Handler]*route
	holders map[*Handler]bool
}

// add records h, which applied its settings with next after it.
func (a *appliers) add(h *Handler, next caddyhttp.Handler) {
	a.handedOn(&route{h: h, next: next, of: h})
}

// handedOn records r.h, which applied its settings with route r
// recorded for it (its own, or one that stands for it: reloadapply.go).
func (a *appliers) handedOn(r *route) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.m == nil {
		a.m = make(map[*Handler]*route)
	}
	a.m[r.h] = r
	delete(a.holders, r.h)
}

// hold records h, provisioned with a reference to the engine, as a
// holder.
func (a *appliers) hold(h *Handler) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.holders == nil {
		a.holders = make(map[*Handler]bool)
	}
	a.holders[h] = true
}

func (a *appliers) remove(h *Handler) {
	a.mu.Lock()
	defer a.mu.Unlock()
	delete(a.m, h)
	delete(a.holders, h)
}

// newestHolder is the newest holder whose config is still loaded; nil if
// none.
func (a *appliers) newestHolder() *Handler {
	a.mu.Lock()
	all := make([]*Handler, 0, len(a.holders))
	for h := range a.holders {
		all = append(all, h)
	}
	a.mu.Unlock()
	return newestLoadedOf(all)
}

// newestLoaded is the newest applier whose config is still loaded, and
// its route; nil if none.
func (a *appliers) newestLoaded() (*Handler, *route) {
	a.mu.Lock()
	all := make([]*Handler, 0, len(a.m))
	routes := make(map[*Handler]*route, len(a.m))
	for h, r := range a.m {
		all = append(all, h)
		routes[h] = r
	}
	a.mu.Unlock()
	newest := newestLoadedOf(all)
	return newest, routes[newest]
}

// newestLoadedOf is the newest of hs, by provisioning number, whose
// config is still loaded; nil if none. Liveness takes each handler's
// mu: the caller reads hs with its own lock released.
func newestLoadedOf(hs []*Handler) *Handler {
	var newest *Handler
	for _, h := range hs {
		if h.loaded() && (newest == nil || h.gen > newest.gen) {
			newest = h
		}
	}
	return newest
}

// loaded reports whether the handler's config is loaded: not cleaned up,
// its context not done.
func (h *Handler) loaded() bool {
	if !h.live() {
		return false
	}
	select {
	case <-h.load:
		return false
	default:
		return true
	}
}

// handBack runs as h, cleaned up, drops its reference to e (restore);
// if no handler of the config in force has applied its settings to e,
// the newest one that holds e applies its own where it safely can.
func (e *engine) handBack(h *Handler) {
	e.appliers.remove(h)
	if none, fresh := e.restore(h); none {
		e.handOn(h, fresh)
	}
}

// restore runs as h, no longer among e's appliers, drops its reference
// to e (cleaned up, or the queue idle): if h's settings are in force, the
// newest applier whose config is still loaded applies its own again; with
// none, the next handler to use e applies its own. A handler of a config
// that fails to load may have dropped an idle queue before: its settings
// must not stay in force there either. It reports whether h's settings
// were in force and no applier took over, and whether they were those h
// opened e with at its provisioning, no request having applied any since
// (fresh: none has waited in e or run on a route of it).
func (e *engine) restore(h *Handler) (none, fresh bool) {
	e.mu.Lock()
	// Opened with h's settings at its provisioning, e has them in force
	// until a handler applies its own.
	fresh = e.gen == 0 && e.settingsGen == h.gen
	mine := e.gen == h.gen || fresh
	if mine {
		e.gen = 0 // none in force: the next to apply does
	}
	e.mu.Unlock()
	if !mine {
		return false, false
	}
	if y, r := e.appliers.newestLoaded(); y != nil {
		if f := e.routes.plain.Load(); f != nil && f.h == h && y.gen < h.gen {
			e.routes.failed.Store(f) // h's config failed: see staticInForce
		}
		e.routes.restore(r)
		y.applySettings(e)
		return false, false
	}
	return true, fresh
}
