package caddyfairqueue

import (
	"bytes"
	"encoding/json"
	"reflect"
	"strings"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp/reverseproxy"
)

// What follows a fair_queue handler in its server, read from the
// provisioned routes, and whether two handlers are followed alike: a
// reload that leaves it unchanged may hand more permits on at its
// cleanup (reloadapply.go).

// chainAfter lists the handlers that a request h passes on runs, up to
// and with the first reverse_proxy, in h's server; ok is false where
// the config cannot tell them: h not found in its server's routes, a
// route on the way with matchers or in a group, a subroute or an invoke
// of a named route on the way, or no reverse_proxy at the end.
func chainAfter(h *Handler) (chain []caddyhttp.MiddlewareHandler, ok bool) {
	if h.srv == nil {
		return nil, false
	}
	path := findHandler(h.srv.Routes, h)
	if path == nil {
		return nil, false
	}
	// From the innermost route list that holds h outwards: the rest of
	// h's route, then the routes after it, then what follows the
	// subroute in the list around it.
	for i := len(path) - 1; i >= 0; i-- {
		at := path[i]
		for ri := at.route; ri < len(at.routes); ri++ {
			r := at.routes[ri]
			from := 0
			if ri == at.route {
				from = at.handler + 1
			} else if len(r.MatcherSets) > 0 || r.Group != "" {
				return nil, false
			}
			for _, next := range r.Handlers[from:] {
				switch next.(type) {
				case *reverseproxy.Handler:
					return append(chain, next), true
				case *caddyhttp.Subroute, *caddyhttp.Invoke:
					return nil, false
				}
				chain = append(chain, next)
			}
			if r.Terminal {
				return nil, false
			}
		}
	}
	return nil, false
}

// routeAt is a place in a route list: the route and the handler in it.
type routeAt struct {
	routes  caddyhttp.RouteList
	route   int
	handler int
}

// findHandler returns where h is in routes, from the outermost list to
// the one that holds h (one place per subroute on the way); nil if not
// there.
func findHandler(routes caddyhttp.RouteList, h *Handler) []routeAt {
	for ri, r := range routes {
		for hi, x := range r.Handlers {
			if x == caddyhttp.MiddlewareHandler(h) {
				return []routeAt{{routes, ri, hi}}
			}
			if sub, ok := x.(*caddyhttp.Subroute); ok {
				if inner := findHandler(sub.Routes, h); inner != nil {
					return append([]routeAt{{routes, ri, hi}}, inner...)
				}
			}
		}
	}
	return nil
}

// sameChain reports whether two chains of handlers are alike: the same
// modules with the same config, and reverse_proxy with its upstreams in
// its config (a dynamic source's config is not kept once loaded) and
// none read from a placeholder (resolved per request, from what handlers
// before fair_queue set: the same text may lead elsewhere), the same
// transport and no handle_response (see sameTransport); other handlers
// that load modules of their own (intercept's routes, for one) are never
// alike: their JSON no longer shows those modules.
func sameChain(a, b []caddyhttp.MiddlewareHandler) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if !sameHandler(a[i], b[i]) {
			return false
		}
	}
	return true
}

func sameHandler(a, b caddyhttp.MiddlewareHandler) bool {
	ma, ok := a.(caddy.Module)
	if !ok {
		return false
	}
	mb, ok := b.(caddy.Module)
	if !ok || ma.CaddyModule().ID != mb.CaddyModule().ID {
		return false
	}
	for _, x := range []caddyhttp.MiddlewareHandler{a, b} {
		switch x := x.(type) {
		case *reverseproxy.Handler:
			if !staticUpstreams(x) {
				return false
			}
		default:
			// A module loaded from its config (intercept's routes, a
			// plugin's own upstreams) is gone from the JSON then.
			if loadsModules(reflect.TypeOf(x), map[reflect.Type]bool{}) {
				return false
			}
		}
	}
	if ra, ok := a.(*reverseproxy.Handler); ok && !sameTransport(ra, b.(*reverseproxy.Handler)) {
		return false
	}
	ja, err := json.Marshal(a)
	if err != nil {
		return false
	}
	jb, err := json.Marshal(b)
	return err == nil && bytes.Equal(ja, jb)
}

// loadsModules reports whether values of type t hold a field that Caddy
// loads a module from (a caddy:"namespace=..." tag), at any depth.
func loadsModules(t reflect.Type, seen map[reflect.Type]bool) bool {
	if seen[t] {
		return false
	}
	seen[t] = true
	switch t.Kind() {
	case reflect.Pointer, reflect.Slice, reflect.Array:
		return loadsModules(t.Elem(), seen)
	case reflect.Map:
		return loadsModules(t.Key(), seen) || loadsModules(t.Elem(), seen)
	case reflect.Struct:
		for i := range t.NumField() {
			f := t.Field(i)
			if strings.HasPrefix(f.Tag.Get("caddy"), "namespace=") || loadsModules(f.Type, seen) {
				return true
			}
		}
	}
	return false
}

// staticUpstreams reports whether rp's upstreams are all in its config,
// each at an address without placeholders.
func staticUpstreams(rp *reverseproxy.Handler) bool {
	if rp.DynamicUpstreams != nil || len(rp.Upstreams) == 0 {
		return false
	}
	for _, u := range rp.Upstreams {
		if strings.Contains(u.Dial, "{") {
			return false
		}
	}
	return true
}

// sameTransport reports whether two reverse_proxy handlers send their
// requests alike. Caddy drops a module's raw config once it has loaded
// it, so their JSON keeps neither the transport (its DNS resolvers may
// send one upstream address elsewhere) nor the handlers of
// handle_response (which may proxy on): the loaded transports are
// compared instead, and a handler with handle_response is never alike.
func sameTransport(a, b *reverseproxy.Handler) bool {
	if len(a.HandleResponse) > 0 || len(b.HandleResponse) > 0 {
		return false
	}
	if a.Transport == nil || b.Transport == nil {
		return a.Transport == nil && b.Transport == nil
	}
	ma, ok := a.Transport.(caddy.Module)
	if !ok {
		return false
	}
	mb, ok := b.Transport.(caddy.Module)
	if !ok || ma.CaddyModule().ID != mb.CaddyModule().ID {
		return false
	}
	ja, err := json.Marshal(a.Transport)
	if err != nil {
		return false
	}
	jb, err := json.Marshal(b.Transport)
	return err == nil && bytes.Equal(ja, jb)
}
