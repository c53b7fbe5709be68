// Package caddyfairqueue is the Caddy v2 module http.handlers.fair_queue
// and its Caddyfile directive fair_queue: a cluster-wide fair queue, kept
// in Redis, in front of backends that can serve only so many requests at
// once (LLM servers). Requests beyond the permits wait in one queue shared
// by every Caddy instance, in arrival order, and continue to the next
// handler (reverse_proxy) the moment a permit frees anywhere; those that
// wait too long get a clear answer, JSON or a server-sent event.
//
// The queue itself is package fairqueue, usable without Caddy; this
// package is the Caddy glue.
package caddyfairqueue

import (
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
)

func init() {
	caddy.RegisterModule(new(Handler))
}

// Defaults of the handler's options.
const (
	// DefaultName is the queue name when none is given.
	DefaultName = "default"
	// DefaultMaxBody is the largest request body read, 8 MiB.
	DefaultMaxBody = 8 << 20
)

// On-store-error policies.
const (
	// FailOpen admits requests without a permit while the store is
	// unreachable.
	FailOpen = "fail_open"
	// FailClosed rejects requests with store_unavailable while the store
	// is unreachable.
	FailClosed = "fail_closed"
)

// Handler holds each request in a cluster-wide fair queue until one of
// the queue's permits is free, then passes it to the next handler
// (normally reverse_proxy) and keeps the permit until that handler has
// written the whole response, streams included.
//
// Before queueing it reads the whole request body (see MaxBody) and the
// top-level "model" and "stream" keys of a JSON body; the next handler
// receives the same bytes.
//
// It sets these placeholders, for logs and later handlers:
//
//	{http.fair_queue.queue}        the queue name (Name, placeholders replaced)
//	{http.fair_queue.model}        the "model" of the JSON request body, or empty
//	{http.fair_queue.streaming}    true for a streaming request (Accept: text/event-stream or "stream": true)
//	{http.fair_queue.outcome}      granted, fail_open, cancelled, or the reject reason
//	{http.fair_queue.reason}       the reject reason; store_unavailable for fail_open
//	{http.fair_queue.wait_ms}      time spent waiting for the permit, in milliseconds
//	{http.fair_queue.position}     tickets ahead at enqueue plus one; 0 when granted at once
//
// The same values appear in the access log, in a "fair_queue" object.
type Handler struct {
	// Name of the queue. Every handler, on every Caddy instance, that
	// names the same queue in the same Redis (address, database and key
	// prefix) shares its permits and its order. Placeholders are
	// replaced per request, so that one handler can keep a queue per
	// model ({http.fair_queue.model}) or per header; such a handler opens
	// at most 100 queues, and a request naming a queue beyond that, or a
	// name longer than 200 bytes, is rejected with queue_full. A name
	// that resolves to nothing is "default". Default "default".
	Name string `json:"name,omitempty"`

	// Permits is how many requests of the queue may be served at once,
	// across the whole cluster. Required, at least 1. During a rolling
	// config change each instance applies its own value to the calls it
	// makes.
	Permits int `json:"permits,omitempty"`

	// MaxWait is the longest a request waits for a permit before it is
	// rejected with reason timeout. Default 20s.
	MaxWait caddy.Duration `json:"max_wait,omitempty"`

	// PollInterval is how often an instance with waiters checks the
	// queue in Redis, the safety net for lost wake-ups and expired
	// leases (permits normally move at once, by notification). Default
	// 200ms; at least 50ms and at most MaxWait.
	PollInterval caddy.Duration `json:"poll_interval,omitempty"`

	// MaxBody is the largest request body, in bytes, that the handler
	// reads before queueing; a larger one is answered with 413 at once.
	// The body is held in memory while the request waits. Default 8 MiB.
	MaxBody int64 `json:"max_body,omitempty"`

	// Lease is how long a permit stays held without renewal. Instances
	// renew the leases of their permits every Lease/3, so a crashed
	// instance's permits come back after at most Lease; a running
	// response is never cut. Default 30s, at least 1s.
	Lease caddy.Duration `json:"lease,omitempty"`

	// Redis is where the queues live. Required for now (an in-process
	// queue for single instances will make it optional).
	Redis *RedisConfig `json:"redis,omitempty"`

	// OnStoreError is the policy for a request that finds Redis
	// unreachable (its call fails, or earlier consecutive failures marked
	// Redis down and no call is tried until one succeeds again):
	// "fail_open" admits it without a permit (the outage is logged, and
	// counted in the fail_open outcome); "fail_closed" rejects it with
	// reason store_unavailable (503). Requests already waiting keep
	// waiting until MaxWait either way. Default "fail_open".
	OnStoreError string `json:"on_store_error,omitempty"`

	// Reject shapes the answers to requests that get no permit, per
	// reason. See RejectConfig for the defaults.
	Reject []*RejectConfig `json:"reject,omitempty"`

	logger   *zap.Logger
	backend  backend
	policies map[fairqueue.Reason]*rejectPolicy
	dynamic  bool   // Name has placeholders
	gen      uint64 // provisioning number
	claim    *claimKey

	mu      sync.Mutex
	engines map[string]*engineRef // pool keys this handler holds
	cleaned bool
	capOnce sync.Once // logs the queue cap once
}

// CaddyModule returns the Caddy module information.
func (*Handler) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "http.handlers.fair_queue",
		New: func() caddy.Module { return new(Handler) },
	}
}

// Provision sets defaults, validates the config and takes a reference to
// the queue engine of a static queue name. It makes no network call and
// changes nothing in a running queue: it also runs for `caddy validate`
// and for reloads that fail later. The handler's settings reach a shared
// engine when the handler serves its first request.
func (h *Handler) Provision(ctx caddy.Context) error {
	h.logger = ctx.Logger()
	h.gen = provisions.Add(1)
	h.engines = make(map[string]*engineRef)
	h.setDefaults()
	if err := h.validate(); err != nil {
		return err
	}
	policies, err := compileRejects(h.Reject)
	if err != nil {
		return err
	}
	h.policies = policies
	h.backend, err = newStore(h.Redis, caddy.NewReplacer())
	if err != nil {
		return err
	}
	registerMetrics(ctx.GetMetricsRegistry())

	if srv, ok := ctx.Value(caddyhttp.ServerCtxKey).(*caddyhttp.Server); ok {
		srv.RegisterOnShutdown(func() { h.onShutdown(exiting()) })
	}

	h.dynamic = strings.Contains(h.Name, "{")
	if h.dynamic {
		return nil
	}
	if err := h.addClaim(ctx); err != nil {
		return err
	}
	// Take the reference now, so that a reload hands the engine from the
	// old handler to this one without closing it in between.
	key := h.backend.key() + "|queue=" + h.Name
	e, err := h.loadEngine(key, h.Name)
	if err != nil {
		return err
	}
	h.engines[key] = &engineRef{e: e}
	return nil
}

func (h *Handler) setDefaults() {
	if h.Name == "" {
		h.Name = DefaultName
	}
	if h.MaxWait == 0 {
		h.MaxWait = caddy.Duration(fairqueue.DefaultMaxWait)
	}
	if h.PollInterval == 0 {
		h.PollInterval = caddy.Duration(fairqueue.DefaultPollInterval)
	}
	if h.Lease == 0 {
		h.Lease = caddy.Duration(fairqueue.DefaultLease)
	}
	if h.MaxBody == 0 {
		h.MaxBody = DefaultMaxBody
	}
	if h.OnStoreError == "" {
		h.OnStoreError = FailOpen
	}
}

// validate checks the options after defaults; errors name the option.
func (h *Handler) validate() error {
	switch {
	case h.Permits <= 0:
		return fmt.Errorf("permits must be at least 1, got %d", h.Permits)
	case h.MaxWait < 0:
		return fmt.Errorf("max_wait must be positive, got %s", time.Duration(h.MaxWait))
	case time.Duration(h.PollInterval) < fairqueue.MinPollInterval:
		return fmt.Errorf("poll_interval must be at least %s, got %s", fairqueue.MinPollInterval, time.Duration(h.PollInterval))
	case h.PollInterval > h.MaxWait:
		return fmt.Errorf("poll_interval (%s) must not exceed max_wait (%s)", time.Duration(h.PollInterval), time.Duration(h.MaxWait))
	case time.Duration(h.Lease) < fairqueue.MinLease:
		return fmt.Errorf("lease must be at least %s, got %s", fairqueue.MinLease, time.Duration(h.Lease))
	case h.MaxBody < 0:
		return fmt.Errorf("max_body must be positive, got %d", h.MaxBody)
	case h.OnStoreError != FailOpen && h.OnStoreError != FailClosed:
		return fmt.Errorf("on_store_error must be %s or %s, got %q", FailOpen, FailClosed, h.OnStoreError)
	}
	return nil
}

func (h *Handler) settings() queueSettings {
	return queueSettings{
		permits:      h.Permits,
		maxWait:      time.Duration(h.MaxWait),
		pollInterval: time.Duration(h.PollInterval),
		lease:        time.Duration(h.Lease),
		failOpen:     h.OnStoreError == FailOpen,
	}
}

// queueConfig is the engine configuration of queue name.
func (h *Handler) queueConfig(name string) fairqueue.Config {
	s := h.settings()
	return fairqueue.Config{
		Name:         name,
		Permits:      s.permits,
		MaxWait:      s.maxWait,
		PollInterval: s.pollInterval,
		Lease:        s.lease,
		FailOpen:     s.failOpen,
		Logger:       h.logger,
	}
}

// onShutdown runs when the server starts shutting down. On exit every
// waiter of the handler's queues is answered with shutting_down at once,
// so that the grace period serves only running responses; on a reload
// nothing happens: the new config's handlers share the queues.
func (h *Handler) onShutdown(exiting bool) {
	if !exiting {
		return
	}
	for _, e := range h.engineList() {
		e.q.RejectWaiters()
	}
}

// Cleanup drops the handler's references to its queues. It never waits:
// a queue used by no handler any more closes when its last request is
// done (at once when the process exits).
func (h *Handler) Cleanup() error {
	h.dropClaim()
	return h.releaseEngines()
}

// Interface guards
var (
	_ caddy.Provisioner           = (*Handler)(nil)
	_ caddy.CleanerUpper          = (*Handler)(nil)
	_ caddyhttp.MiddlewareHandler = (*Handler)(nil)
	_ caddy.Destructor            = (*engine)(nil)
	_ caddy.Destructor            = (*redisClient)(nil)
)
