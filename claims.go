package caddyfairqueue

import (
	"fmt"
	"sync"
	"time"

	"github.com/caddyserver/caddy/v2"
)

// queueSettings are the settings of one queue that every fair_queue
// handler of one config naming that queue must agree on: they share one
// engine.
type queueSettings struct {
	permits           int
	maxWait           time.Duration
	pollInterval      time.Duration
	lease             time.Duration
	onStoreError      string
	localPermits      int
	fair              bool
	priorityFactor    float64
	maxQueue          int
	maxQueuePerTenant int
}

// diff names the first setting in which s and o differ, with both values.
func (s queueSettings) diff(o queueSettings) string {
	switch {
	case s.permits != o.permits:
		return fmt.Sprintf("permits (%d and %d)", s.permits, o.permits)
	case s.maxWait != o.maxWait:
		return fmt.Sprintf("max_wait (%s and %s)", s.maxWait, o.maxWait)
	case s.pollInterval != o.pollInterval:
		return fmt.Sprintf("poll_interval (%s and %s)", s.pollInterval, o.pollInterval)
	case s.lease != o.lease:
		return fmt.Sprintf("lease (%s and %s)", s.lease, o.lease)
	case s.onStoreError != o.onStoreError:
		return fmt.Sprintf("on_store_error (%s and %s)", s.onStoreError, o.onStoreError)
	case s.localPermits != o.localPermits:
		return fmt.Sprintf("local_permits (%d and %d)", s.localPermits, o.localPermits)
	case s.fair != o.fair:
		return "fairness (tenant or priority set in one only)"
	case s.priorityFactor != o.priorityFactor:
		return fmt.Sprintf("priority_factor (%v and %v)", s.priorityFactor, o.priorityFactor)
	case s.maxQueue != o.maxQueue:
		return fmt.Sprintf("max_queue (%d and %d)", s.maxQueue, o.maxQueue)
	case s.maxQueuePerTenant != o.maxQueuePerTenant:
		return fmt.Sprintf("max_queue_per_tenant (%d and %d)", s.maxQueuePerTenant, o.maxQueuePerTenant)
	}
	return ""
}

// claims records, per config load, the settings of every queue a handler
// names statically, to refuse a config whose handlers disagree on one
// queue. A config load is identified by its context's Done channel, which
// every module provisioned from it shares.
var claims = struct {
	sync.Mutex
	m map[claimKey]*claim
}{m: make(map[claimKey]*claim)}

type claimKey struct {
	load  <-chan struct{}
	queue string // store location and queue name
}

type claim struct {
	settings queueSettings
	refs     int
}

// addClaim registers the handler's settings for its queue in the config
// load of ctx, or reports how they differ from another handler's.
func (h *Handler) addClaim(ctx caddy.Context) error {
	load := ctx.Done()
	if load == nil {
		return nil
	}
	k := claimKey{load: load, queue: h.backend.location() + "|queue=" + h.Name}
	s := h.settings()
	claims.Lock()
	defer claims.Unlock()
	if c := claims.m[k]; c != nil {
		if d := c.settings.diff(s); d != "" {
			return fmt.Errorf("queue %q is configured by two fair_queue handlers with different %s; handlers naming one queue must agree", h.Name, d)
		}
		c.refs++
	} else {
		claims.m[k] = &claim{settings: s, refs: 1}
	}
	h.claim = &k
	return nil
}

func (h *Handler) dropClaim() {
	if h.claim == nil {
		return
	}
	claims.Lock()
	defer claims.Unlock()
	if c := claims.m[*h.claim]; c != nil {
		if c.refs--; c.refs <= 0 {
			delete(claims.m, *h.claim)
		}
	}
	h.claim = nil
}
