package scale

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/fair-queue/caddy-fair-queue/bench/internal/procs"
	"github.com/fair-queue/caddy-fair-queue/bench/internal/report"
	"github.com/fair-queue/caddy-fair-queue/bench/internal/scenario"
	"github.com/fair-queue/caddy-fair-queue/bench/internal/systems"
	"github.com/fair-queue/caddy-fair-queue/internal/loadgen"
)

// scaleQueues measures set.Queues queues on one node and one Redis, the
// handler naming its queue from the X-Queue header.
func scaleQueues(ctx context.Context, b *scenario.Runner, env *systems.Env, set report.ScaleSettings) (*report.ScaleQueues, error) {
	q := &report.ScaleQueues{}
	spec := systems.Spec{Name: "fq-queues", Label: "fair_queue Redis, queue per header", Kind: systems.KindFairQueue, Nodes: 1, Redis: true}
	qenv := *env
	qenv.Permits = set.QueuePermits
	r, err := systems.StartNodes(ctx, &qenv, spec, "{http.request.header.X-Queue}")
	if err != nil {
		return q, err
	}
	var loads []*scenario.Background
	defer func() {
		var wg sync.WaitGroup
		for _, bg := range loads {
			wg.Go(bg.Stop)
		}
		wg.Wait()
		env.Stop(r)
	}()
	name := func(i int) string { return fmt.Sprintf("scale-q%03d", i) }
	// Let Redis free what the deep queue's teardown left (client buffers).
	if err := scenario.SleepCtx(ctx, 3*time.Second); err != nil {
		return q, err
	}
	mem0, err := redisUsedMemory(ctx, b)
	if err != nil {
		return q, err
	}
	// Warm on the first queue: every name opens a queue, and a handler
	// opens at most 100.
	if _, err := b.Load(ctx, r.Targets, loadgen.Config{Clients: 4, Duration: 300 * time.Millisecond, Tokens: 1, Delay: time.Millisecond,
		Header: map[string][]string{"X-Queue": {name(0)}}}); err != nil {
		return q, err
	}
	if err := b.ResetCounters(ctx); err != nil {
		return q, err
	}
	var waiting []*scenario.Background
	open := func(from, to int) error {
		for i := from; i < to; i++ {
			h := map[string]string{"X-Queue": name(i)}
			hold, err := scenario.StartLoad(ctx, holdConfig(r.Targets, set.QueuePermits, h))
			if err != nil {
				return err
			}
			loads = append(loads, hold)
		}
		if !scenario.WaitFor(ctx, 30*time.Second, func() bool {
			st, err := b.MockStats(ctx)
			return err == nil && st.InFlight >= to*set.QueuePermits
		}) {
			return fmt.Errorf("the permits of %d queues were not all taken within 30s", to)
		}
		for i := from; i < to; i++ {
			h := map[string]string{"X-Queue": name(i)}
			w, err := scenario.StartLoad(ctx, waitConfig(r.Targets, set.QueueWaiters, set.PromptBytes, 100, h))
			if err != nil {
				return err
			}
			loads = append(loads, w)
			waiting = append(waiting, w)
		}
		total := func() int64 {
			var n int64
			for i := range to {
				n += max(queueDepth(ctx, b, name(i)), 0)
			}
			return n
		}
		if !scenario.WaitFor(ctx, 30*time.Second, func() bool { return total() >= int64(to*set.QueueWaiters) }) {
			return fmt.Errorf("only %d of %d waiters queued in %d queues", total(), to*set.QueueWaiters, to)
		}
		q.Waiting = total()
		return scenario.SleepCtx(ctx, time.Second)
	}
	if err := open(0, 1); err != nil {
		return q, err
	}
	if q.OneCmdsPerS, _, _, err = idleOver(ctx, b, report.Secs(set.IdleWindowS)); err != nil {
		return q, err
	}
	mem, err := redisUsedMemory(ctx, b)
	if err != nil {
		return q, err
	}
	q.OneMem = mem - mem0
	q.RSSOne, _ = procs.RSS(r.PIDs()[0])
	q.Queues = 1
	b.Logf("   1 queue (%d held, %d waiting): Redis %.1f cmds/s idle, +%.1f KiB used_memory",
		set.QueuePermits, set.QueueWaiters, q.OneCmdsPerS, float64(q.OneMem)/1024)
	if err := open(1, set.Queues); err != nil {
		return q, err
	}
	q.Queues = set.Queues
	if q.ManyCmdsPerS, _, q.ManyCommands, err = idleOver(ctx, b, report.Secs(set.IdleWindowS)); err != nil {
		return q, err
	}
	if mem, err = redisUsedMemory(ctx, b); err != nil {
		return q, err
	}
	q.ManyMem = mem - mem0
	q.RSSMany, _ = procs.RSS(r.PIDs()[0])
	for _, w := range waiting {
		c := w.Counters()
		q.Served += c.Granted.Load()
		q.Failed += c.Failed.Load()
		q.Rejected += c.Rejected.Load()
	}
	b.Logf("   %d queues (%d held, %d waiting each; %d waiting): Redis %.1f cmds/s idle, +%.1f KiB used_memory, RSS %.1f -> %.1f MiB; served %d, failed %d, rejected %d",
		q.Queues, set.QueuePermits, set.QueueWaiters, q.Waiting, q.ManyCmdsPerS, float64(q.ManyMem)/1024,
		float64(q.RSSOne)/(1<<20), float64(q.RSSMany)/(1<<20), q.Served, q.Failed, q.Rejected)
	return q, nil
}
