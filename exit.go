package caddyfairqueue

import (
	"context"
	"sync"
	"time"

	"github.com/caddyserver/caddy/v2"
	"go.uber.org/zap"
)

// The process's exit, for the queues a reload retired while requests
// still used them (a reload that renamed the queue, dropped its route or
// its server). Their handlers' servers were shut down for that reload, not
// for the exit, so no handler's onShutdown answers their waiters when the
// process exits, and no handler's Cleanup closes them: one goroutine
// watches for the exit while such a queue is open and answers its waiters
// at once, and an exit callback, run once the grace period is over,
// releases what they still hold and leaves them.

// exitPoll is how often the watcher checks whether the process is
// exiting; Caddy has no hook at the start of an exit for a module that
// the config in force does not hold.
const exitPoll = 100 * time.Millisecond

func init() {
	caddy.OnExit(closeRetired)
}

// exitWatch is the one goroutine that watches for the exit while a
// retired engine is open.
var exitWatch struct {
	mu      sync.Mutex
	running bool
}

// watchExit starts the watcher unless it runs; Destruct calls it for an
// engine it retires open.
func watchExit() {
	exitWatch.mu.Lock()
	defer exitWatch.mu.Unlock()
	if !exitWatch.running {
		exitWatch.running = true
		go exitWatcher()
	}
}

// exitWatcher answers the waiters of the retired engines once the process
// exits; it stops then, or when no retired engine is open (one retired
// later starts it again: watchExit).
func exitWatcher() {
	t := time.NewTicker(exitPoll)
	defer t.Stop()
	for range t.C {
		exitWatch.mu.Lock()
		retired := retiredEngines()
		ending := exiting()
		if ending || len(retired) == 0 {
			exitWatch.running = false
		}
		exitWatch.mu.Unlock()
		if ending {
			// An engine retired from now on closes at once (Destruct).
			for _, e := range retired {
				e.q.RejectWaiters()
			}
		}
		if ending || len(retired) == 0 {
			return
		}
	}
}

// retiredEngines lists the engines a reload retired that are still open.
func retiredEngines() []*engine {
	var out []*engine
	for _, e := range openEngines() {
		if e.retiredFlag.Load() {
			out = append(out, e)
		}
	}
	return out
}

// closeRetired runs at the exit once the servers have shut down (the grace
// period is over): a retired queue whose requests still run releases
// their permits and leaves, as the config's queues did at their cleanup.
// They leave together, as a handler's queues do (releaseEngines).
func closeRetired(context.Context) {
	var wg sync.WaitGroup
	for _, e := range retiredEngines() {
		wg.Go(func() {
			e.q.RejectWaiters()
			if err := e.close(); err != nil {
				e.log.Warn("closing retired queue", zap.String("queue", e.name), zap.Error(err))
			}
		})
	}
	wg.Wait()
}
