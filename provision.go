package caddyfairqueue

import (
	"strings"
	"sync/atomic"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
)

// The handler's life in a config: provisioned at load (also for caddy
// validate), told when its server starts shutting down, cleaned up after
// a reload or at exit.

// Provision sets defaults, validates the config and takes a reference to
// the queue engine of a static queue name. It makes no network call and
// changes nothing in a running queue: it also runs for `caddy validate`
// and for reloads that fail later. The handler's settings reach a shared
// engine when the handler serves its first request, or when a reload
// that succeeds cleans up the handler whose settings were in force
// (reloadapply.go).
//
// A config error names the JSON field at fault (jsonError): the
// Caddyfile refuses most mistakes at adapt, naming its own option. One
// met only here, a placeholder replaced at load ({env.*} empty), names
// the Caddyfile's option too, where it is spelled apart (atLoad).
func (h *Handler) Provision(ctx caddy.Context) error {
	return jsonError(h.provision(ctx))
}

func (h *Handler) provision(ctx caddy.Context) error {
	h.logger = ctx.Logger()
	registerConnContext(ctx)
	h.gen = provisions.Add(1)
	h.load = ctx.Done()
	h.engines = make(map[engineKey]*engineRef)
	h.setDefaults()
	if err := h.validate(); err != nil {
		return err
	}
	policies, err := compileRejects(h.Reject)
	if err != nil {
		return err
	}
	h.policies = policies
	if h.Weights, err = expandWeights(h.Weights, caddy.NewReplacer()); err != nil {
		return err
	}
	h.backend, err = newStore(h.Redis, caddy.NewReplacer(), h.logger)
	if err != nil {
		return inField("redis", err)
	}
	if h.RejectStream != nil {
		rb, ok := h.backend.(*redisBackend)
		if !ok {
			return errRejectStreamNeedsRedis
		}
		if h.rejects, err = newRejectStream(h.RejectStream, rb, h.logger); err != nil {
			return inField("reject_stream", err)
		}
	}
	registerMetrics(ctx.GetMetricsRegistry())
	checkPlacement(ctx, h.logger)

	if srv, ok := ctx.Value(caddyhttp.ServerCtxKey).(*caddyhttp.Server); ok {
		h.srv = srv
		srv.RegisterOnShutdown(func() { h.onShutdown(exiting()) })
	}

	h.dynamic = strings.Contains(h.Name, "{")
	h.names = nameSet(h.Names)
	h.joinLoad(ctx)
	if h.dynamic {
		h.addTemplate()
		return nil
	}
	if err := h.addClaim(ctx); err != nil {
		return err
	}
	// Take the reference now, so that a reload hands the engine from the
	// old handler to this one without closing it in between. A queue
	// opened here has this handler's settings, but none in force yet
	// (provisioning number 0): the config in force may name it from the
	// request and use it before this config serves, or fails to load,
	// and its settings must then apply.
	key := newEngineKey(h.backend, h.Name)
	e, err := h.loadEngine(key, 0)
	if err != nil {
		return err
	}
	h.engines[key] = &engineRef{e: e}
	e.appliers.hold(h)
	namesakes.use(e, h.load)
	return nil
}

// shutDown, if set, runs as a handler's server starts shutting down
// (onShutdown): Go's server calls it once its listeners are closed, and
// Caddy's reload returns before its old servers get there, so that a
// connection accepted meanwhile reaches the old config's handler. Tests
// set it to know when the server of a config load they replaced no
// longer accepts connections (the handler's load tells which).
var shutDown atomic.Pointer[func(*Handler)]

// onShutdown runs when the server starts shutting down. On exit every
// waiter of the handler's queues is answered with shutting_down at once,
// so that the grace period serves only running responses; on a reload
// nothing happens: the new config's handlers share the queues.
func (h *Handler) onShutdown(exiting bool) {
	if f := shutDown.Load(); f != nil {
		(*f)(h)
	}
	if !exiting {
		return
	}
	h.mu.Lock()
	h.exiting = true
	h.mu.Unlock()
	for _, e := range h.engineList() {
		e.q.RejectWaiters()
	}
}

// Cleanup drops the handler's references to its queues. It never waits:
// a queue used by no handler any more closes when its last request is
// done (at once when the process exits).
func (h *Handler) Cleanup() error {
	h.dropClaim()
	h.dropTemplate()
	h.rejects.close()
	return h.releaseEngines()
}
