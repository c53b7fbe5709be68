package caddyfairqueue

import (
	"time"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
)

// engineObserver is the Observer of an engine's queue: the handler's
// (newObserver), which it passes the events on to, but for the
// shutting_down rejects of the queue once it moved (engine.move): those
// end a wait that goes on in the queue in force (acquire), which
// refuses nobody; acquire counts the one it gives up. It counts the
// engine's grants for the admin API (engine.grants).
type engineObserver struct {
	fairqueue.Observer
	e *engine
}

// Granted implements fairqueue.Observer.
func (o engineObserver) Granted(wait time.Duration, queued bool) {
	o.e.grants.Add(1)
	o.Observer.Granted(wait, queued)
}

// Rejected implements fairqueue.Observer.
func (o engineObserver) Rejected(r fairqueue.Reason, wait time.Duration) {
	if r == fairqueue.ReasonShuttingDown && o.e.moved.Load() {
		return
	}
	o.Observer.Rejected(r, wait)
}

// observed is cfg with its Observer, the handler's, wrapped for e
// (engineObserver); a config read from another engine's queue (adopt)
// is unwrapped first.
func (e *engine) observed(cfg fairqueue.Config) fairqueue.Config {
	if o, ok := cfg.Observer.(engineObserver); ok {
		cfg.Observer = o.Observer
	}
	if cfg.Observer != nil {
		cfg.Observer = engineObserver{Observer: cfg.Observer, e: e}
	}
	return cfg
}

// Interface guard
var _ fairqueue.Observer = engineObserver{}
