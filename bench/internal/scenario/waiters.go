package scenario

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/fair-queue/caddy-fair-queue/bench/internal/procs"
	"github.com/fair-queue/caddy-fair-queue/bench/internal/report"
	"github.com/fair-queue/caddy-fair-queue/bench/internal/systems"
	"github.com/fair-queue/caddy-fair-queue/internal/loadgen"
)

// Background is a load running in its own goroutine until canceled.
type Background struct {
	r      *loadgen.Runner
	cancel context.CancelFunc
	done   chan struct{}
	rep    *loadgen.Report // set when done
}

// startBackground sends n requests that stay open: with hold, n
// concurrent streams that last minutes (they take the permits); else n
// requests arriving at rate per second, which wait in the queue.
func (b *Runner) startBackground(ctx context.Context, targets []string, n, promptBytes int, hold bool, rate float64) (*Background, error) {
	cfg := loadgen.Config{
		Targets: targets, PromptBytes: promptBytes, MaxInFlight: n,
		Stream: true, Tokens: 1, Delay: 10 * time.Millisecond, Timeout: 15 * time.Minute,
	}
	if hold {
		cfg.Clients, cfg.Requests, cfg.Delay = n, n, 10*time.Minute
	} else {
		// Arrivals at i/rate for i < n-0.5: exactly n of them.
		cfg.Rate, cfg.Duration = rate, time.Duration((float64(n)-0.5)/rate*float64(time.Second))
	}
	return StartLoad(ctx, cfg)
}

// Counters are the load's counters, live.
func (bg *Background) Counters() *loadgen.Counters { return bg.r.Counters() }

// Stop cuts every request of the load and waits for them to end.
func (bg *Background) Stop() {
	bg.cancel()
	<-bg.done
}

// WaitFor polls cond every 50ms until it holds or timeout passes.
func WaitFor(ctx context.Context, timeout time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) && ctx.Err() == nil {
		if cond() {
			return true
		}
		time.Sleep(50 * time.Millisecond)
	}
	return cond()
}

// waiters starts spec afresh, takes every permit with endless streams,
// queues w requests with prompts of promptBytes behind them, arriving at
// rate per second, and measures the Caddy node's RSS per waiter and, with
// idle, Redis commands per second while they wait (compared with a few
// waiters). Whatever else it measures, it counts the waiters that reached
// the upstream without a permit.
func (b *Runner) waiters(ctx context.Context, spec systems.Spec, w, promptBytes int, rate float64, idle bool) (*report.WaiterRun, error) {
	run := &report.WaiterRun{System: spec.Name, Waiters: w, PromptBytes: promptBytes, RampRPS: rate}
	// Own logs and queue per run.
	spec.Name = fmt.Sprintf("%s-waiters-%dk-%.0f", spec.Name, promptBytes>>10, rate)
	r, err := b.Env.Start(ctx, spec)
	if err != nil {
		return nil, err
	}
	var loads, waiting []*Background
	defer func() {
		var wg sync.WaitGroup
		for _, bg := range loads {
			wg.Go(bg.Stop)
		}
		wg.Wait()
		b.Env.Stop(r)
		for _, bg := range waiting {
			if bg.rep == nil {
				continue
			}
			for reason, n := range bg.rep.ByReason {
				if run.Reasons == nil {
					run.Reasons = map[string]int{}
				}
				run.Reasons[reason] += n
			}
		}
	}()
	if err := b.Warm(ctx, r); err != nil {
		return nil, err
	}
	if err := b.ResetCounters(ctx); err != nil {
		return nil, err
	}

	hold, err := b.startBackground(ctx, r.Targets, b.Env.Permits, 16, true, 0)
	if err != nil {
		return nil, err
	}
	loads = append(loads, hold)
	if !WaitFor(ctx, 10*time.Second, func() bool {
		st, err := b.MockStats(ctx)
		return err == nil && st.InFlight >= b.Env.Permits
	}) {
		return nil, errors.New("the permits were not all taken within 10s")
	}

	depth := func() int64 {
		if !spec.Redis {
			return -1
		}
		tag := "{fair_queue:" + r.Queue + "}"
		n, err := b.RDB.ZCard(ctx, tag+":waiting").Result()
		if err != nil {
			return -1
		}
		f, err := b.RDB.HLen(ctx, tag+":fticket").Result() // fair tickets waiting
		if err != nil {
			return -1
		}
		return n + f
	}
	// queue starts n waiters and waits until they are all queued.
	queue := func(n, prompt int, want int64) (int64, error) {
		bg, err := b.startBackground(ctx, r.Targets, n, prompt, false, rate)
		if err != nil {
			return 0, err
		}
		loads = append(loads, bg)
		waiting = append(waiting, bg)
		ok := WaitFor(ctx, 90*time.Second, func() bool {
			if spec.Redis {
				return depth() >= want
			}
			// No queue to read: count the connections to the node.
			conns, err := procs.Established(r.Port(0))
			return err == nil && conns >= int(want)+b.Env.Permits
		})
		time.Sleep(time.Second) // settle: bodies read, goroutines parked
		if !ok {
			return depth(), fmt.Errorf("only %d of %d waiters queued within 90s", depth(), want)
		}
		if !spec.Redis {
			return int64(n), nil
		}
		return depth(), nil
	}

	const base = 10
	if idle && spec.Redis {
		if _, err := queue(base, promptBytes, base); err != nil {
			return nil, err
		}
		run.BaseWaiters = base
		run.BaseCmdsPerS, _, err = b.idleRate(ctx)
		if err != nil {
			return nil, err
		}
	}
	pid := r.PIDs()[0]
	if run.RSSBefore, err = procs.RSS(pid); err != nil {
		return nil, err
	}
	want := int64(w + run.BaseWaiters)
	queued, err := queue(w, promptBytes, want)
	run.Queued = max(queued-int64(run.BaseWaiters), 0)
	if err != nil {
		run.Note = err.Error()
	}
	if run.RSSAfter, err = procs.RSS(pid); err != nil {
		return nil, err
	}
	if run.Queued > 0 && err == nil {
		run.RSSPerWaiter = report.Round(float64(run.RSSAfter-run.RSSBefore)/1024/float64(run.Queued), 1)
	}
	if idle && spec.Redis {
		run.IdleCmdsPerS, run.IdleScripts, err = b.idleRate(ctx)
		if err != nil {
			return nil, err
		}
		run.IdleWindowSec = b.Res.Settings.IdleWindowS
	}
	// No waiter may be served while the permits are held: one that was
	// got in without a permit (e.g. fail_open).
	for _, bg := range waiting {
		c := bg.r.Counters()
		run.Served += c.Granted.Load()
		run.Failed += c.Failed.Load()
		run.Rejected += c.Rejected.Load()
	}
	if st, err := b.MockStats(ctx); err == nil {
		run.UpstreamMax = st.MaxInFlight
	}
	line := fmt.Sprintf("   %d waiters (%d B prompts): %d queued, RSS %.1f -> %.1f MiB = %.1f KiB per waiter",
		w, promptBytes, run.Queued, float64(run.RSSBefore)/(1<<20), float64(run.RSSAfter)/(1<<20), run.RSSPerWaiter)
	if run.BaseWaiters > 0 {
		line += fmt.Sprintf("; Redis %.1f cmds/s idle (%.1f with %d waiters)", run.IdleCmdsPerS, run.BaseCmdsPerS, run.BaseWaiters)
	}
	if run.Served+run.Failed+run.Rejected > 0 || run.UpstreamMax > b.Env.Permits {
		line += fmt.Sprintf("; WAITERS NOT WAITING: %d served, %d failed, %d rejected, upstream max %d",
			run.Served, run.Failed, run.Rejected, run.UpstreamMax)
	}
	b.Logf("%s", line)
	return run, nil
}

// idleRate returns the Redis commands and script calls per second over
// the idle window.
func (b *Runner) idleRate(ctx context.Context) (cmds, scripts float64, err error) {
	before, err := procs.ReadCommandStats(ctx, b.RDB)
	if err != nil {
		return 0, 0, err
	}
	window := report.Secs(b.Res.Settings.IdleWindowS)
	start := time.Now()
	select {
	case <-time.After(window):
	case <-ctx.Done():
		return 0, 0, ctx.Err()
	}
	after, err := procs.ReadCommandStats(ctx, b.RDB)
	if err != nil {
		return 0, 0, err
	}
	d := after.Sub(before)
	s := time.Since(start).Seconds()
	return report.Round(float64(d.Total())/s, 1), report.Round(float64(d.Scripts())/s, 1), nil
}

// StartLoad runs cfg in a goroutine until canceled.
func StartLoad(ctx context.Context, cfg loadgen.Config) (*Background, error) {
	r, err := loadgen.New(cfg)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(ctx)
	bg := &Background{r: r, cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(bg.done)
		bg.rep, _ = r.Run(ctx)
	}()
	return bg, nil
}

// SleepCtx sleeps d, or until ctx is done (its error).
func SleepCtx(ctx context.Context, d time.Duration) error {
	select {
	case <-time.After(d):
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// GenericError drops the addresses and numbers of an error message, so
// that the same error from many connections counts as one:
// "dial tcp 127.0.0.1:4711: i/o timeout" -> "dial tcp N.N.N.N:N: i/o timeout".
func GenericError(msg string) string {
	var b strings.Builder
	digits := false
	for _, r := range msg {
		if r >= '0' && r <= '9' {
			if !digits {
				b.WriteByte('N')
			}
			digits = true
			continue
		}
		digits = false
		b.WriteRune(r)
	}
	return b.String()
}
