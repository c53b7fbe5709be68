package caddyfairqueue

import (
	"errors"
	"fmt"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
)

// Bounds of the fairness options.
const (
	// maxTenantLen bounds the tenant value that is hashed and compared:
	// the rest of a longer value is ignored, so that a huge header costs
	// no more CPU than this.
	maxTenantLen = 1 << 10
	minWeight    = 0.01
	maxWeight    = 1000
)

func (h *Handler) setDefaults() {
	if h.Name == "" {
		h.Name = DefaultName
	}
	if h.MaxWait == 0 {
		h.MaxWait = caddy.Duration(fairqueue.DefaultMaxWait)
	}
	if h.PollInterval == 0 {
		// A short max wait needs no longer interval than itself.
		h.PollInterval = min(caddy.Duration(fairqueue.DefaultPollInterval), h.MaxWait)
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
	if h.Cost == CostMaxTokens && h.MaxCost == 0 {
		h.MaxCost = DefaultMaxCost
	}
	if h.PriorityFactor == 0 {
		h.PriorityFactor = fairqueue.DefaultPriorityFactor
	}
}

// validate checks the options after defaults; errors name the option.
func (h *Handler) validate() error {
	switch {
	case h.Permits <= 0:
		return fmt.Errorf("permits must be at least 1, got %d", h.Permits)
	case h.MaxWait < 0:
		return fmt.Errorf("max_wait must be positive, got %s", time.Duration(h.MaxWait))
	case time.Duration(h.MaxWait) < fairqueue.MinPollInterval:
		return fmt.Errorf("max_wait must be at least %s (the smallest poll_interval), got %s", fairqueue.MinPollInterval, time.Duration(h.MaxWait))
	case time.Duration(h.PollInterval) < fairqueue.MinPollInterval:
		return fmt.Errorf("poll_interval must be at least %s, got %s", fairqueue.MinPollInterval, time.Duration(h.PollInterval))
	case h.PollInterval > h.MaxWait:
		return fmt.Errorf("poll_interval (%s) must not exceed max_wait (%s)", time.Duration(h.PollInterval), time.Duration(h.MaxWait))
	case time.Duration(h.Lease) < fairqueue.MinLease:
		return fmt.Errorf("lease must be at least %s, got %s", fairqueue.MinLease, time.Duration(h.Lease))
	case h.MaxBody < 0:
		return fmt.Errorf("max_body must be positive, got %d", h.MaxBody)
	case h.SSEKeepalive >= h.MaxWait:
		return fmt.Errorf("sse_keepalive (%s) must be shorter than max_wait (%s), or it never fires", time.Duration(h.SSEKeepalive), time.Duration(h.MaxWait))
	}
	return h.checkOptions()
}

// checkOptions checks the store-error and fairness options. It needs no
// defaults applied, so that the Caddyfile parser runs it too.
func (h *Handler) checkOptions() error {
	switch {
	case h.OnStoreError != "" && h.OnStoreError != FailOpen && h.OnStoreError != FailClosed && h.OnStoreError != FailLocal:
		return fmt.Errorf("on_store_error must be %s, %s or %s, got %q", FailOpen, FailClosed, FailLocal, h.OnStoreError)
	case h.LocalPermits < 0:
		return fmt.Errorf("local_permits must be >= 0, got %d", h.LocalPermits)
	case h.LocalPermits > 0 && h.OnStoreError != FailLocal:
		return fmt.Errorf("local_permits requires on_store_error %s", FailLocal)
	case len(h.Weights) > 0 && h.Tenant == "":
		return fmt.Errorf("weight requires tenant")
	case h.WeightPlaceholder != "" && h.Tenant == "":
		return fmt.Errorf("weight_placeholder requires tenant")
	case h.MaxQueuePerTenant != 0 && h.Tenant == "":
		return fmt.Errorf("max_queue_per_tenant requires tenant")
	case h.Cost != "" && h.Cost != CostMaxTokens:
		return fmt.Errorf("cost must be %s, got %q", CostMaxTokens, h.Cost)
	case h.Cost != "" && h.Tenant == "" && h.Priority == "":
		return fmt.Errorf("cost requires tenant or priority (a FIFO queue has no use for it)")
	case h.MaxCost != 0 && h.Cost == "":
		return fmt.Errorf("max_cost requires cost %s", CostMaxTokens)
	case h.MaxCost < 0 || h.MaxCost > fairqueue.MaxCost:
		return fmt.Errorf("max_cost must be 1 to %d, got %d", int(fairqueue.MaxCost), h.MaxCost)
	case h.PriorityFactor != 0 && !(h.PriorityFactor >= 2): // NaN too
		return fmt.Errorf("priority_factor must be at least 2, got %v", h.PriorityFactor)
	case h.MaxQueue < 0:
		return fmt.Errorf("max_queue must be >= 0, got %d", h.MaxQueue)
	case h.MaxQueuePerTenant < 0:
		return fmt.Errorf("max_queue_per_tenant must be >= 0, got %d", h.MaxQueuePerTenant)
	case h.SSEKeepalive != 0 && time.Duration(h.SSEKeepalive) < minSSEKeepalive:
		return fmt.Errorf("sse_keepalive must be at least %s, got %s", minSSEKeepalive, time.Duration(h.SSEKeepalive))
	case h.SSEQueueEvents && h.SSEKeepalive == 0:
		return fmt.Errorf("sse_queue_events requires sse_keepalive")
	case h.RejectStream != nil && h.Redis == nil:
		return errRejectStreamNeedsRedis
	}
	if h.RejectStream != nil {
		if err := h.RejectStream.check(); err != nil {
			return err
		}
	}
	for v, w := range h.Weights {
		if len(v) > maxTenantLen {
			return fmt.Errorf("weight: a tenant value is longer than %d bytes (tenant values are cut there)", maxTenantLen)
		}
		if !(w >= minWeight && w <= maxWeight) {
			return fmt.Errorf("weight must be %v to %v, got %v", minWeight, maxWeight, w)
		}
	}
	return nil
}

// errRejectStreamNeedsRedis: reject_stream writes to the queues' Redis.
var errRejectStreamNeedsRedis = errors.New("reject_stream requires a redis block (the stream is written to the queues' Redis)")

func (h *Handler) settings() queueSettings {
	return queueSettings{
		permits:           h.Permits,
		maxWait:           time.Duration(h.MaxWait),
		pollInterval:      time.Duration(h.PollInterval),
		lease:             time.Duration(h.Lease),
		onStoreError:      h.OnStoreError,
		localPermits:      h.LocalPermits,
		fair:              h.Tenant != "" || h.Priority != "",
		priorityFactor:    h.PriorityFactor,
		maxQueue:          h.MaxQueue,
		maxQueuePerTenant: h.MaxQueuePerTenant,
	}
}

// queueConfig is the engine configuration of queue name; fallback is
// the engine's own in-process store for on_store_error local.
func (h *Handler) queueConfig(name string, fallback fairqueue.Store) fairqueue.Config {
	s := h.settings()
	cfg := fairqueue.Config{
		Name:              name,
		Permits:           s.permits,
		MaxWait:           s.maxWait,
		PollInterval:      s.pollInterval,
		Lease:             s.lease,
		Fair:              s.fair,
		PriorityFactor:    s.priorityFactor,
		MaxQueue:          s.maxQueue,
		MaxQueuePerTenant: s.maxQueuePerTenant,
		FailOpen:          s.onStoreError == FailOpen,
		Logger:            h.logger,
		Observer:          newObserver(name),
	}
	if s.onStoreError == FailLocal {
		cfg.Fallback, cfg.LocalPermits = fallback, s.localPermits
	}
	return cfg
}
