package caddyfairqueue

import (
	"encoding/json"
	"slices"
	"strings"
	"sync"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp/reverseproxy"
	"go.uber.org/zap"
)

// A fair_queue protects only the requests that reach it and then go on to
// a reverse_proxy. In a Caddyfile, handle, route and respond blocks run
// before every handler directive of the site block: a site-level
// fair_queue beside `handle /v1/* { reverse_proxy ... }` never sees the
// proxied requests, and queues only requests nothing proxies. Caddy says
// the config is valid. checkPlacement finds that shape when the server
// is provisioned (also for caddy validate) and says so.

// placementChecked holds the servers whose routes were checked, one
// check per server and config load (the first fair_queue provisioned in
// it runs it).
var placementChecked sync.Map // *caddyhttp.Server -> struct{}

// proxying are the handlers that pass a request on to an upstream, or
// may (an invoke of a named route this check could not read).
var proxying = map[string]bool{"reverse_proxy": true, "invoke": true}

// checkPlacement logs a warning for each fair_queue of the server being
// provisioned after which no reverse_proxy runs. It reads the routes'
// JSON: Caddy provisions the routes in order and this runs at the first
// fair_queue, so every fair_queue is in the routes still to provision
// (which keep their JSON until then).
func checkPlacement(ctx caddy.Context, log *zap.Logger) {
	srv, ok := ctx.Value(caddyhttp.ServerCtxKey).(*caddyhttp.Server)
	if !ok || srv == nil {
		return
	}
	if _, done := placementChecked.LoadOrStore(srv, struct{}{}); done {
		return
	}
	ctx.OnCancel(func() { placementChecked.Delete(srv) })

	w := placementWalk{named: srv.NamedRoutes}
	w.typedRoutes(srv.Routes, nil)
	for _, fq := range w.stranded() {
		log.Warn("fair_queue has no reverse_proxy after it: it queues requests that nothing proxies, and the requests a reverse_proxy serves are never queued; "+
			"handle, route and respond blocks run before any directive of the site block, so put fair_queue inside the block of the reverse_proxy it protects, before it (see the README, \"Where fair_queue goes\")",
			zap.String("queue", fq.name), zap.Strings("server_listen", srv.Listen), zap.Bool("reverse_proxy_before_it", fq.proxiedBefore))
	}
	for _, name := range w.unpooled() {
		log.Warn("fair_queue has upstream lines, but the reverse_proxy after it does not take the granted upstream: it sends each request where its own upstreams and load balancing say, "+
			"so no upstream is held to its permits and a requeue cools another than the one that answered; "+
			"give that reverse_proxy no upstreams and `dynamic fair_queue` instead (see docs/pools.md)",
			zap.String("queue", name), zap.Strings("server_listen", srv.Listen))
	}
}

// placementWalk lists a server's handlers in the order a request meets
// them (subroutes inline).
type placementWalk struct {
	handlers []walkedHandler
	routeNo  int // the routes with matchers numbered so far
	// named are the server's named routes: an invoke runs one in its
	// place, and the walk reads it there (inlined: those it is in).
	named   map[string]*caddyhttp.Route
	inlined []string
	// read counts the named routes read at an invoke and the handlers
	// met in them, up to maxNamedRead: named routes that invoke one
	// more than once each (Caddy provisions every named route once)
	// would be read 2^depth times.
	read int
}

// maxNamedRead bounds what the walk reads of named routes (see
// placementWalk.read): past it, an invoke stays an invoke, a handler
// that may proxy, of which nothing is said.
const maxNamedRead = 10000

type walkedHandler struct {
	module string // the handler's module name: fair_queue, reverse_proxy, subroute...
	name   string // a fair_queue's queue name
	// pooled: a fair_queue with upstream lines, or a reverse_proxy that
	// takes the granted upstream (dynamic fair_queue).
	pooled bool
	// matched numbers the routes with matchers it is in, outermost
	// first: a request runs it only where those match.
	matched []int
}

// stranded is a fair_queue after which no handler proxies.
type stranded struct {
	name          string
	proxiedBefore bool // a reverse_proxy comes before it
}

func (w *placementWalk) stranded() []stranded {
	var out []stranded
	proxied, last := false, -1
	for i, h := range w.handlers {
		if proxying[h.module] {
			last = i
		}
	}
	for i, h := range w.handlers {
		switch {
		case proxying[h.module]:
			proxied = true
		case h.module == "fair_queue" && i > last:
			out = append(out, stranded{name: h.name, proxiedBefore: proxied})
		}
	}
	return out
}

// unpooled names the fair_queues with upstream lines whose requests go
// to a reverse_proxy that does not take the granted upstream: the first
// proxying handler after it that runs wherever it ran, or, before that,
// only reverse_proxies of routes whose matchers it does not share (a
// site's `reverse_proxy /metrics ...`, which Caddy sorts before
// `reverse_proxy /v1/*`: a longer path first). A reverse_proxy that
// takes the granted upstream, or an invoke, ends the search with no word.
func (w *placementWalk) unpooled() []string {
	var out []string
	for i, h := range w.handlers {
		if h.module != "fair_queue" || !h.pooled {
			continue
		}
		static := false // a reverse_proxy of its own upstreams it may reach
		for _, next := range w.handlers[i+1:] {
			if !proxying[next.module] {
				continue
			}
			if next.module != "reverse_proxy" || next.pooled {
				static = false
				break
			}
			static = true
			if !h.outside(next) {
				break
			}
		}
		if static {
			out = append(out, h.name)
		}
	}
	return out
}

// outside reports whether next runs only where a matcher that h does not
// run under matches: not every request of h's reaches it.
func (h walkedHandler) outside(next walkedHandler) bool {
	for _, m := range next.matched {
		if !slices.Contains(h.matched, m) {
			return true
		}
	}
	return false
}

// matchedRoute is matched with the route numbered next added when the
// route has matchers (any): its handlers run only where they match.
func (w *placementWalk) matchedRoute(matched []int, any bool) []int {
	if !any {
		return matched
	}
	w.routeNo++
	return append(slices.Clip(matched), w.routeNo)
}

// typedRoutes walks routes whose handlers may be provisioned already
// (their JSON gone), in matched (see walkedHandler).
func (w *placementWalk) typedRoutes(routes caddyhttp.RouteList, matched []int) {
	for i := range routes {
		w.route(&routes[i], matched)
	}
}

// route walks one route whose handlers may be provisioned already, in
// matched.
func (w *placementWalk) route(r *caddyhttp.Route, matched []int) {
	m := w.matchedRoute(matched, len(r.MatcherSetsRaw) > 0 || len(r.MatcherSets) > 0)
	if r.HandlersRaw != nil {
		w.routes(r.HandlersRaw, m)
	} else {
		w.typed(r.Handlers, m)
	}
}

// invoke walks the named route name in the place of the invoke that
// runs it, in matched. One not found, invoked from within itself, or
// past what the walk reads of named routes (maxNamedRead), stays an
// invoke: a handler that may proxy (proxying).
func (w *placementWalk) invoke(name string, matched []int) {
	r := w.named[name]
	if r == nil || slices.Contains(w.inlined, name) || w.read >= maxNamedRead {
		w.add("invoke", name, matched)
		return
	}
	w.read++
	w.inlined = append(w.inlined, name)
	w.route(r, matched)
	w.inlined = w.inlined[:len(w.inlined)-1]
}

// routes walks the JSON of one route's handlers, in matched.
func (w *placementWalk) routes(handlers []json.RawMessage, matched []int) {
	for _, raw := range handlers {
		var h struct {
			Handler string `json:"handler"`
			Name    string `json:"name"`
			Routes  []struct {
				Match  []json.RawMessage `json:"match"`
				Handle []json.RawMessage `json:"handle"`
			} `json:"routes"`
			Upstreams        []json.RawMessage `json:"upstreams"`
			DynamicUpstreams struct {
				Source string `json:"source"`
			} `json:"dynamic_upstreams"`
		}
		if json.Unmarshal(raw, &h) != nil {
			continue
		}
		if h.Handler == "invoke" {
			w.invoke(h.Name, matched)
			continue
		}
		w.add(h.Handler, h.Name, matched)
		switch h.Handler {
		case "fair_queue":
			w.handlers[len(w.handlers)-1].pooled = len(h.Upstreams) > 0
		case "reverse_proxy":
			w.handlers[len(w.handlers)-1].pooled = h.DynamicUpstreams.Source == "fair_queue"
		}
		if h.Handler == "subroute" {
			for _, r := range h.Routes {
				w.routes(r.Handle, w.matchedRoute(matched, len(r.Match) > 0))
			}
		}
	}
}

// typed walks handlers already provisioned, in matched.
func (w *placementWalk) typed(handlers []caddyhttp.MiddlewareHandler, matched []int) {
	for _, h := range handlers {
		switch h := h.(type) {
		case *caddyhttp.Subroute:
			w.add("subroute", "", matched)
			w.typedRoutes(h.Routes, matched)
		case *caddyhttp.Invoke:
			w.invoke(h.Name, matched)
		case *Handler:
			w.add("fair_queue", h.Name, matched)
			w.handlers[len(w.handlers)-1].pooled = h.pooled()
		case *reverseproxy.Handler:
			w.add("reverse_proxy", "", matched)
			_, dynamic := h.DynamicUpstreams.(*Upstreams)
			w.handlers[len(w.handlers)-1].pooled = dynamic
		case caddy.Module:
			w.add(caddy.GetModuleName(h), "", matched)
		}
	}
}

func (w *placementWalk) add(module, name string, matched []int) {
	if module == "fair_queue" && strings.TrimSpace(name) == "" {
		name = DefaultName
	}
	if len(w.inlined) > 0 {
		w.read++
	}
	w.handlers = append(w.handlers, walkedHandler{module: module, name: name, matched: matched})
}
