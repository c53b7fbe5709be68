package caddyfairqueue

import (
	"context"
	"net/http"
	"sync"
	"sync/atomic"
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
// releases what they still hold and leaves them. The watcher answers
// too the waiters of a queue that a request borrowed on a handler the
// reload cleaned up (it reached the old server after the reload:
// Handler.use), as that server was shut down for the reload as well.

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
// engine it retires open, Handler.use for an engine it borrows.
func watchExit() {
	exitWatch.mu.Lock()
	defer exitWatch.mu.Unlock()
	if !exitWatch.running {
		exitWatch.running = true
		go exitWatcher()
	}
}

// exitWatcher answers the waiters of the retired and borrowed engines
// once the process exits; it stops then, or when none is open (one
// retired or borrowed later starts it again: watchExit).
func exitWatcher() {
	t := time.NewTicker(exitPoll)
	defer t.Stop()
	for range t.C {
		exitWatch.mu.Lock()
		watched := openEnginesWhere(isWatched)
		ending := exiting()
		if ending || len(watched) == 0 {
			exitWatch.running = false
		}
		exitWatch.mu.Unlock()
		if ending {
			// An engine retired from now on closes at once (Destruct);
			// one borrowed from now on starts a watcher again.
			for _, e := range watched {
				e.q.RejectWaiters()
			}
		}
		if ending || len(watched) == 0 {
			return
		}
	}
}

// openEnginesWhere lists the open engines that keep.
func openEnginesWhere(keep func(*engine) bool) []*engine {
	var out []*engine
	for _, e := range openEngines() {
		if keep(e) {
			out = append(out, e)
		}
	}
	return out
}

// isRetired reports whether a reload retired e (it may still be open).
func isRetired(e *engine) bool { return e.retiredFlag.Load() }

// isWatched reports whether no handler's onShutdown answers e's waiters at
// the exit: retired, or borrowed by a request.
func isWatched(e *engine) bool { return isRetired(e) || e.borrows.Load() > 0 }

// closeRetired runs at the exit once the servers have shut down (the grace
// period is over): a retired queue whose requests still run releases
// their permits and leaves, as the config's queues did at their cleanup.
// They leave together, as a handler's queues do (releaseEngines).
func closeRetired(context.Context) {
	var wg sync.WaitGroup
	for _, e := range openEnginesWhere(isRetired) {
		wg.Go(func() {
			e.q.RejectWaiters()
			e.endRunning()
			if err := e.close(); err != nil {
				e.log.Warn("closing retired queue", zap.String("queue", e.name), zap.Error(err))
			}
		})
	}
	wg.Wait()
}

// A request still running when the process exits past its grace period
// runs at the upstream until the process ends. Leaving the queue would
// free its permit at once, and another instance's waiter would reach the
// upstream beside it: the exit first ends the instance's running requests
// (their contexts, so reverse_proxy closes the upstream's connection),
// lets each hold its permit for its abort grace as any aborted request
// does, and leaves once they are done (engine.endRunning). Only requests
// of a shared store (Redis) take part: a local queue's permits are this
// process's alone.

// cut is the context whose end ends the forwarded requests that took it.
type cut struct {
	ctx    context.Context
	cancel context.CancelFunc
}

func newCut() *cut {
	ctx, cancel := context.WithCancel(context.Background())
	return &cut{ctx, cancel}
}

// currentCut is the cut a request forwarded now takes; cutRunning ends
// it and puts a new one in its place (a test process goes on serving).
var currentCut atomic.Pointer[cut]

func init() { currentCut.Store(newCut()) }

// cutRunning ends every forwarded request that took the cut in force.
func cutRunning() { currentCut.Swap(newCut()).cancel() }

// cancelable gives r, in place (Caddy's placeholders read the request
// there), a context that ends with its own or when cancel is called. It
// runs before r is first passed on: later, the transport may still be
// sending a refused sending's body (the upstream answered before reading
// its end), and reverse_proxy reads the trailers of r when that body
// ends, so nothing may write r then.
func cancelable(r *http.Request) (cancel context.CancelFunc) {
	ctx, cancel := context.WithCancel(r.Context())
	*r = *r.WithContext(ctx)
	return cancel
}

// hookCut ends, by cancel, a request whose context cancelable made,
// with the exit's cut; unhook, once the request is done, leaves it to
// end with its own context alone, which frees it (net/http ends a
// request's context when its handler returns).
func hookCut(cancel context.CancelFunc) (unhook func() bool) {
	return context.AfterFunc(currentCut.Load().ctx, cancel)
}

// endRunningSlack bounds, beyond the abort grace, how long the exit waits
// for the requests it ended: their releases are store calls, each bounded
// by the store's timeouts.
const endRunningSlack = 3 * time.Second

// endRunning ends the requests still in e when the process exits, and
// waits until they are done or the bound passes: the longest abort grace
// of the handlers that serve the requests still in e, and a little more
// (not that of a handler a reload dropped whose requests have ended).
// The leave (close) then frees only what is left.
func (e *engine) endRunning() {
	if !e.remote {
		return
	}
	start := time.Now()
	for {
		e.mu.Lock()
		n, grace := e.active, e.longestGrace()
		e.mu.Unlock()
		if n == 0 || time.Since(start) > grace+endRunningSlack {
			return
		}
		// Again each round: a request forwarded meanwhile (a requeued
		// one) took the new cut.
		cutRunning()
		time.Sleep(10 * time.Millisecond)
	}
}

// longestGrace is the longest abort grace of the handlers that serve the
// requests in e; e.mu is held.
func (e *engine) longestGrace() time.Duration {
	var longest time.Duration
	for g := range e.graces {
		longest = max(longest, g)
	}
	return longest
}
