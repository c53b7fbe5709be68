package caddyfairqueue

import (
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"
)

// A handler's references to the engines of its queues: use, the idle
// queues it gives back, and its references at cleanup.

// engineRef is a handler's reference to an engine.
type engineRef struct {
	e *engine
	// configure applies this handler's settings to the engine once, at
	// its first request; the handler's other requests wait for it, so
	// that none is granted under the settings of the config it replaces.
	configure sync.Once

	// Under the handler's mu: the handler's requests in the engine,
	// since when it has had none, and the timer that drops the reference
	// of a queue named from the request once it has been idle queueIdle.
	active    int
	idleSince time.Time
	idle      *time.Timer
}

// configuring runs as a handler starts applying its settings to an
// engine; tests use it to hold that moment.
var configuring = func(*engine) {}

// errTooManyQueues: a request named a new queue beyond the handler's cap.
var errTooManyQueues = fmt.Errorf("more than %d queues from one fair_queue handler", maxQueuesPerHandler)

// use returns the engine of queue name, entered: the caller must call
// done when the request is over. The first use of an engine by a handler
// applies the handler's settings to it.
func (h *Handler) use(name string, next caddyhttp.Handler) (e *engine, done func(), err error) {
	key := newEngineKey(h.backend, name)
	h.mu.Lock()
	if h.exiting {
		// A request that comes as the server shuts down for the exit
		// (its body still arriving then, an HTTP/2 stream open): a queue
		// opened for it now, or since given back, has not had its
		// waiters answered (onShutdown).
		defer func() {
			if e != nil {
				e.q.RejectWaiters()
			}
		}()
	}
	if h.cleaned {
		// A request that reached an old handler after its cleanup (a
		// reload): borrow a reference for this request only, and leave
		// the settings to the new config. The cap on queues still
		// applies: the name may be client input.
		if !h.borrowed[key] {
			if len(h.borrowed) >= h.queueCap() {
				h.mu.Unlock()
				return nil, nil, errTooManyQueues
			}
			h.borrowed[key] = true
		}
		h.mu.Unlock()
		if live := namesakes.movedFrom(h, name); live != nil {
			// The config in force keeps this queue in another store: the
			// request waits there (a queue opened here for it would count
			// nobody else's requests).
			grace := h.abortGrace()
			live.enter(grace)
			return live, func() { live.exit(grace) }, nil
		}
		e, err := h.loadEngine(key, h.gen)
		if err != nil {
			return nil, nil, err
		}
		e.enter(h.abortGrace())
		// Its server was shut down for the reload, not for the exit: no
		// handler's onShutdown answers its waiters when the process exits.
		e.borrows.Add(1)
		watchExit()
		return e, func() {
			e.borrows.Add(-1)
			e.exit(h.abortGrace())
			h.dropEngine(key)
		}, nil
	}
	ref := h.engines[key]
	var evicted *evictedRef
	if ref == nil {
		if len(h.engines) >= h.queueCap() {
			// At the cap a queue that has no request in it gives its slot
			// up: only queues in use can keep a new name out.
			if evicted = h.evictIdle(); evicted == nil {
				h.mu.Unlock()
				return nil, nil, errTooManyQueues
			}
		}
		e, err := h.loadEngine(key, h.gen)
		if err != nil {
			h.mu.Unlock()
			if evicted != nil {
				h.dropEvicted(evicted)
			}
			return nil, nil, err
		}
		ref = &engineRef{e: e}
		h.engines[key] = ref
		namesakes.use(e, h.load)
	}
	ref.active++
	ref.e.enter(h.abortGrace())
	h.mu.Unlock()
	if evicted != nil {
		h.dropEvicted(evicted)
	}
	ref.configure.Do(func() {
		configuring(ref.e)
		// The route first: a waiter granted under the new settings finds
		// the route that fits its grant (see route.go).
		ref.e.routes.record(h, next)
		ref.e.appliers.add(h, next)
		h.applySettings(ref.e)
		// Waiters of a queue of this name that a reload moved to this
		// store move in now that a route serves their grants.
		namesakes.moveRetired(ref.e)
	})
	return ref.e, func() {
		ref.e.exit(h.abortGrace())
		h.left(key, ref)
	}, nil
}

// queueCap is how many queues the handler holds at once: the names it
// serves, or maxQueuesPerHandler when any name is opened.
func (h *Handler) queueCap() int {
	return max(maxQueuesPerHandler, len(h.Names))
}

// left ends a request's use of ref; the handler's last request out of a
// queue named from the request starts its idle time.
func (h *Handler) left(key engineKey, ref *engineRef) {
	h.mu.Lock()
	defer h.mu.Unlock()
	ref.active--
	if !h.dynamic || ref.active > 0 || h.engines[key] != ref {
		return
	}
	ref.idleSince = time.Now()
	if ref.idle == nil {
		ref.idle = time.AfterFunc(queueIdle, func() { h.dropIdle(key, ref) })
	} else {
		ref.idle.Reset(queueIdle)
	}
}

// dropIdle gives back the handler's reference to a queue that has had no
// request in it for queueIdle. A request that comes after the removal
// takes a reference of its own (use): the engine stays open if the registry
// still has it, else a new one opens.
func (h *Handler) dropIdle(key engineKey, ref *engineRef) {
	h.mu.Lock()
	if h.engines[key] != ref || ref.active > 0 || time.Since(ref.idleSince) < queueIdle {
		// Cleaned up, in use again, or used since the timer was set
		// (its Reset fires again).
		h.mu.Unlock()
		return
	}
	delete(h.engines, key)
	namesakes.unuse(ref.e, h.load)
	ref.e.appliers.remove(h)
	h.mu.Unlock()
	ref.e.restore(h) // before the reference goes: the engine is open
	idleDropping(key)
	h.dropEngine(key)
}

// evictIdle removes from h.engines the queue idle the longest and
// returns it, for the caller to drop once h.mu is unlocked
// (dropEvicted); nil when every queue has a request in it. Under h.mu.
func (h *Handler) evictIdle() *evictedRef {
	var oldest *engineKey
	var since time.Time
	for k, ref := range h.engines {
		if ref.active == 0 && (oldest == nil || ref.idleSince.Before(since)) {
			oldest, since = &k, ref.idleSince
		}
	}
	if oldest == nil {
		return nil
	}
	ref := h.engines[*oldest]
	if ref.idle != nil {
		ref.idle.Stop()
	}
	delete(h.engines, *oldest)
	namesakes.unuse(ref.e, h.load)
	ref.e.appliers.remove(h)
	return &evictedRef{key: *oldest, e: ref.e}
}

// evictedRef is a reference evictIdle took out of h.engines.
type evictedRef struct {
	key engineKey
	e   *engine
}

// dropEvicted gives back the reference evictIdle took out of h.engines.
func (h *Handler) dropEvicted(ev *evictedRef) {
	ev.e.restore(h) // before the reference goes: the engine is open
	h.dropEngine(ev.key)
}

// loadEngine takes a registry reference to the engine of key; one it
// opens has h's settings, in force as those of provisioning number gen.
func (h *Handler) loadEngine(key engineKey, gen uint64) (*engine, error) {
	v, _, err := engines.LoadOrNew(key, func() (caddy.Destructor, error) {
		return newEngine(h.backend, key.queue, h, gen)
	})
	if err != nil {
		return nil, fmt.Errorf("queue %q: %w", key.queue, err)
	}
	return v.(*engine), nil
}

func (h *Handler) dropEngine(key engineKey) {
	if _, err := engines.Delete(key); err != nil {
		h.logger.Warn("closing queue", zap.Error(err))
	}
}

// applySettings gives a shared engine this handler's settings, the first
// time the handler uses it (not at provision: that also runs for
// `caddy validate` and for reloads that fail later).
func (h *Handler) applySettings(e *engine) {
	old, changed, err := e.reconfigure(h.gen, h.queueConfig(e.name, e.fallback))
	// A retired queue of the same store, still open, hands permits on in
	// the same queue: under these settings too.
	for _, o := range namesakes.sameStore(e) {
		o.adopt(e)
	}
	switch {
	case err != nil:
		h.logger.Error("applying queue settings", zap.String("queue", e.name), zap.Error(err))
	case changed && old.Permits != e.q.Config().Permits:
		h.logger.Info("queue permits changed",
			zap.String("queue", e.name), zap.Int("from", old.Permits), zap.Int("to", e.q.Config().Permits))
	case changed && old.KVTokens != e.q.Config().KVTokens:
		h.logger.Info("queue kv_tokens changed",
			zap.String("queue", e.name), zap.Int("from", old.KVTokens), zap.Int("to", e.q.Config().KVTokens))
	}
}

// engineList returns the engines the handler references.
func (h *Handler) engineList() []*engine {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := make([]*engine, 0, len(h.engines))
	for _, ref := range h.engines {
		out = append(out, ref.e)
	}
	return out
}

// releaseEngines drops the handler's registry references; an engine whose
// last reference this was closes now or after its last request.
func (h *Handler) releaseEngines() error {
	h.mu.Lock()
	h.cleaned = true
	keys := make([]engineKey, 0, len(h.engines))
	held := make([]*engine, 0, len(h.engines))
	if h.borrowed == nil {
		h.borrowed = make(map[engineKey]bool, len(h.engines))
	}
	for k, ref := range h.engines {
		keys = append(keys, k)
		held = append(held, ref.e)
		h.borrowed[k] = true
		if ref.idle != nil {
			ref.idle.Stop()
		}
		namesakes.unuse(ref.e, h.load)
	}
	h.engines = nil
	h.mu.Unlock()
	for _, e := range held {
		e.handBack(h) // before the reference goes: the engine is open
	}
	// The references go together: each may close its engine, whose leave
	// is bounded by the store's timeouts; one after the other, while the
	// store does not answer, they would take those timeouts once per
	// queue (at exit, after the grace period).
	errs := make([]error, len(keys))
	var wg sync.WaitGroup
	for i, k := range keys {
		wg.Go(func() { _, errs[i] = engines.Delete(k) })
	}
	wg.Wait()
	return errors.Join(errs...)
}
