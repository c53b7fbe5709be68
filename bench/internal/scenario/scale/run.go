// Package scale runs the scale scenario: tens of thousands of streams
// waiting across 3 Caddy nodes of one queue, sent by client processes
// of the bench itself (RunClient), then many queues on one Redis. Its
// figures and their report are report.Scale.
package scale

// The scale scenario's runs: the deep queue over 3 nodes.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/fair-queue/caddy-fair-queue/bench/internal/procs"
	"github.com/fair-queue/caddy-fair-queue/bench/internal/report"
	"github.com/fair-queue/caddy-fair-queue/bench/internal/scenario"
	"github.com/fair-queue/caddy-fair-queue/bench/internal/systems"
	"github.com/fair-queue/caddy-fair-queue/internal/loadgen"
)

// Run runs the scale scenario: the deep queue, then the many
// queues. waiters is the deep queue's waiters (0: 50,000), rps their
// arrival rate, all client processes together (0: 700/s).
func Run(ctx context.Context, b *scenario.Runner, waiters int, rps float64) {
	set := report.DefaultScaleSettings(waiters, fileLimit())
	set.Permits = b.Env.Permits
	if rps > 0 {
		set.RampRPS = rps
	}
	s := &report.Scale{Settings: set}
	b.Res.Scale = s
	env := *b.Env
	env.MaxWait = 30 * time.Minute // the deep queue drains for minutes
	spec := systems.Spec{Name: "fq-scale", Label: "fair_queue Redis 3 nodes (scale)", Kind: systems.KindFairQueue, Nodes: set.Nodes, Redis: true}
	s.System = fmt.Sprintf("fair_queue Redis %d nodes, one queue, %d permits", set.Nodes, env.Permits)
	b.Logf("== scale: %d waiters over %d nodes from %d client processes at %.0f/s, %s prompts (open-file limit %d)",
		set.Waiters, set.Nodes, set.ClientProcs, set.RampRPS, report.SizeLabel(set.PromptBytes), set.FDLimit)
	if err := scaleDeep(ctx, b, &env, spec, s); err != nil {
		s.Note = strings.TrimSpace(s.Note + " " + err.Error())
		b.Logf("   deep queue: %v", err)
	}
	if ctx.Err() != nil {
		return
	}
	q, err := scaleQueues(ctx, b, &env, set)
	if err != nil {
		q.Note = strings.TrimSpace(q.Note + " " + err.Error())
		b.Logf("   %d queues: %v", set.Queues, err)
	}
	s.Queues = q
}

// scaleDeep measures the deep queue of one queue over set.Nodes nodes.
func scaleDeep(ctx context.Context, b *scenario.Runner, env *systems.Env, spec systems.Spec, s *report.Scale) error {
	set := s.Settings
	permits := env.Permits
	shares, err := planClients(set.Waiters, set.Nodes, set.ClientProcs, set.FDLimit-set.FDReserve)
	if err != nil {
		return err
	}
	s.Clients = shares
	r, err := systems.StartNodes(ctx, env, spec, "bench-scale")
	if err != nil {
		return err
	}
	var loads []*scenario.Background
	var clients []*procs.Proc
	defer func() {
		var wg sync.WaitGroup
		for _, p := range clients {
			wg.Go(func() { env.Procs.Stop(p) })
		}
		for _, bg := range loads {
			wg.Go(bg.Stop)
		}
		wg.Wait()
		env.Stop(r)
		for _, p := range clients {
			if c, ok := readCounters(p); ok {
				for reason, n := range c.Reasons {
					if s.Reasons == nil {
						s.Reasons = map[string]int{}
					}
					s.Reasons[reason] += n
				}
				for msg, n := range c.Errors {
					if s.Errors == nil {
						s.Errors = map[string]int{}
					}
					s.Errors[scenario.GenericError(msg)] += n
				}
			}
		}
	}()
	if err := b.Warm(ctx, r); err != nil {
		return err
	}
	depth := func() int64 {
		d := queueDepth(ctx, b, r.Queue)
		s.MaxDepth = max(s.MaxDepth, d)
		return d
	}

	// Handoffs with BaseWaiters always waiting: a closed loop of
	// permits + BaseWaiters short streams.
	base, err := scenario.StartLoad(ctx, loadgen.Config{
		Targets: r.Targets, Clients: permits + set.BaseWaiters, Duration: report.Secs(set.HandoffWindowS + 3),
		Stream: true, Tokens: 1, Delay: 10 * time.Millisecond, PromptBytes: set.PromptBytes, Timeout: time.Minute,
	})
	if err != nil {
		return err
	}
	if err := scenario.SleepCtx(ctx, 1500*time.Millisecond); err != nil {
		return err
	}
	if err := b.ResetMock(ctx); err != nil {
		return err
	}
	win := startCPUWindow(r.PIDs(), b.RedisPID, nil)
	var probe report.Handoffs
	probed := probeRedis(ctx, b, report.Secs(set.HandoffWindowS), &probe)
	if err := scenario.SleepCtx(ctx, report.Secs(set.HandoffWindowS)); err != nil {
		return err
	}
	s.HandoffBase, _, err = handoffs(ctx, b)
	if err != nil {
		return err
	}
	win.end(s.HandoffBase, r.PIDs(), b.RedisPID, nil)
	s.HandoffBase.Depth = depth()
	<-probed
	s.HandoffBase.RedisRTTP50, s.HandoffBase.RedisRTTP99 = probe.RedisRTTP50, probe.RedisRTTP99
	base.Stop()
	b.Logf("   handoffs with %d waiting: p50 %.3f ms, p90 %.3f ms, p99 %.3f ms, max %.3f ms (%d, depth %d when read); %s",
		set.BaseWaiters, s.HandoffBase.P50, s.HandoffBase.P90, s.HandoffBase.P99, s.HandoffBase.Max, s.HandoffBase.Count, s.HandoffBase.Depth,
		s.HandoffBase.CPULine())
	if err := scenario.SleepCtx(ctx, time.Second); err != nil {
		return err
	}

	// Every permit held, BaseWaiters queued: the shallow idle load.
	if err := b.ResetCounters(ctx); err != nil {
		return err
	}
	hold, err := scenario.StartLoad(ctx, holdConfig(r.Targets, permits, nil))
	if err != nil {
		return err
	}
	loads = append(loads, hold)
	if !scenario.WaitFor(ctx, 10*time.Second, func() bool {
		st, err := b.MockStats(ctx)
		return err == nil && st.InFlight >= permits
	}) {
		return errors.New("the permits were not all taken within 10s")
	}
	few, err := scenario.StartLoad(ctx, waitConfig(r.Targets, set.BaseWaiters, set.PromptBytes, 1000, nil))
	if err != nil {
		return err
	}
	loads = append(loads, few)
	if !scenario.WaitFor(ctx, 30*time.Second, func() bool { return depth() >= int64(set.BaseWaiters) }) {
		return fmt.Errorf("only %d of %d base waiters queued", depth(), set.BaseWaiters)
	}
	if err := scenario.SleepCtx(ctx, time.Second); err != nil {
		return err
	}
	if s.BaseCmdsPerS, s.BaseScriptsPerS, _, err = idleOver(ctx, b, report.Secs(set.IdleWindowS)); err != nil {
		return err
	}
	if s.RSSBefore, err = rssSum(r.PIDs()); err != nil {
		return err
	}
	if s.RedisMemBefore, err = redisUsedMemory(ctx, b); err != nil {
		return err
	}
	b.Logf("   %d waiting: Redis %.1f cmds/s idle (%.1f scripts/s), RSS %.1f MiB (3 nodes), Redis used_memory %.1f MiB",
		set.BaseWaiters, s.BaseCmdsPerS, s.BaseScriptsPerS, float64(s.RSSBefore)/(1<<20), float64(s.RedisMemBefore)/(1<<20))

	// The deep queue, from the client processes.
	self, err := os.Executable()
	if err != nil {
		return err
	}
	perProc := set.RampRPS / float64(len(shares))
	for i, sh := range shares {
		cfg := waitConfig([]string{r.Targets[sh.Node]}, sh.Waiters, set.PromptBytes, perProc, nil)
		data, err := json.Marshal(cfg)
		if err != nil {
			return err
		}
		path := filepath.Join(env.Dir, fmt.Sprintf("scale-client-%d.json", i+1))
		if err := os.WriteFile(path, data, 0o644); err != nil {
			return err
		}
		p, err := env.Procs.Start(fmt.Sprintf("scale-client-%d", i+1), self, "-scale-client", path)
		if err != nil {
			return err
		}
		clients = append(clients, p)
	}
	want := int64(set.Waiters + set.BaseWaiters)
	ramp := report.Secs(float64(set.Waiters)/set.RampRPS + 90)
	start := time.Now()
	lastLog := start
	var stall error
	for last, lastMove := int64(-1), time.Now(); ; {
		d := depth()
		if d >= want {
			break
		}
		if d > last {
			last, lastMove = d, time.Now()
		}
		for _, p := range clients {
			if p.Exited() {
				stall = fmt.Errorf("client %s exited: %s", p.Name, procs.Tail(p.Log, 300))
			}
		}
		if stall == nil && time.Since(lastMove) > 20*time.Second {
			stall = fmt.Errorf("the queue stopped growing at %d for 20 s", d)
		}
		if stall == nil && time.Since(start) > ramp {
			stall = fmt.Errorf("only %d of %d queued within %s", d, want, ramp)
		}
		if stall != nil {
			break
		}
		if time.Since(lastLog) >= 10*time.Second {
			lastLog = time.Now()
			b.Logf("   queueing: depth %d of %d after %.0f s", d, want, time.Since(start).Seconds())
		}
		if err := scenario.SleepCtx(ctx, 250*time.Millisecond); err != nil {
			return err
		}
	}
	if err := scenario.SleepCtx(ctx, 3*time.Second); err != nil { // settle: bodies read, goroutines parked
		return err
	}
	s.Queued = max(depth()-int64(set.BaseWaiters), 0)
	if stall != nil {
		s.Note = stall.Error()
		b.Logf("   %v", stall)
	}
	b.Logf("   %d waiting after %.0f s", s.Queued, time.Since(start).Seconds())
	if s.RSSAfter, err = rssSum(r.PIDs()); err != nil {
		return err
	}
	if s.RedisMemAfter, err = redisUsedMemory(ctx, b); err != nil {
		return err
	}
	if s.Queued > 0 {
		s.RSSPerWaiterKiB = report.Round(float64(s.RSSAfter-s.RSSBefore)/1024/float64(s.Queued), 2)
		s.RedisPerWaiterKiB = report.Round(float64(s.RedisMemAfter-s.RedisMemBefore)/1024/float64(s.Queued), 2)
	}
	if s.IdleCmdsPerS, s.IdleScriptsPerS, s.IdleCommands, err = idleOver(ctx, b, report.Secs(set.IdleWindowS)); err != nil {
		return err
	}
	// Nobody may have got in while every permit was held.
	for _, p := range clients {
		c, _ := readCounters(p)
		s.Served += c.Granted
		s.Failed += c.Failed
		s.Rejected += c.Rejected
		s.Dropped += c.Dropped
	}
	fc := few.Counters()
	s.Served += fc.Granted.Load()
	s.Failed += fc.Failed.Load()
	s.Rejected += fc.Rejected.Load()
	if st, err := b.MockStats(ctx); err == nil {
		s.UpstreamMaxHeld = st.MaxInFlight
	}
	b.Logf("   %d waiting: RSS %.1f -> %.1f MiB = %.2f KiB per waiter; Redis %.1f -> %.1f MiB = %.2f KiB per waiter; Redis %.1f cmds/s idle (%.1f with %d); served %d, failed %d, rejected %d, dropped %d, upstream max %d",
		s.Queued, float64(s.RSSBefore)/(1<<20), float64(s.RSSAfter)/(1<<20), s.RSSPerWaiterKiB,
		float64(s.RedisMemBefore)/(1<<20), float64(s.RedisMemAfter)/(1<<20), s.RedisPerWaiterKiB,
		s.IdleCmdsPerS, s.BaseCmdsPerS, set.BaseWaiters, s.Served, s.Failed, s.Rejected, s.Dropped, s.UpstreamMaxHeld)

	// Release the permits: the queue drains, still deep.
	hold.Stop()
	if err := scenario.SleepCtx(ctx, time.Second); err != nil {
		return err
	}
	if err := b.ResetMock(ctx); err != nil {
		return err
	}
	win = startCPUWindow(r.PIDs(), b.RedisPID, procPIDs(clients))
	probe = report.Handoffs{}
	probed = probeRedis(ctx, b, report.Secs(set.HandoffWindowS), &probe)
	if err := scenario.SleepCtx(ctx, report.Secs(set.HandoffWindowS)); err != nil {
		return err
	}
	s.HandoffDeep, s.UpstreamMaxFlow, err = handoffs(ctx, b)
	if err != nil {
		return err
	}
	win.end(s.HandoffDeep, r.PIDs(), b.RedisPID, procPIDs(clients))
	s.HandoffDeep.Depth = depth()
	<-probed
	s.HandoffDeep.RedisRTTP50, s.HandoffDeep.RedisRTTP99 = probe.RedisRTTP50, probe.RedisRTTP99
	b.Logf("   handoffs with %d waiting: p50 %.3f ms, p90 %.3f ms, p99 %.3f ms, max %.3f ms (%d, depth %d when read), upstream max %d; %s",
		s.Queued, s.HandoffDeep.P50, s.HandoffDeep.P90, s.HandoffDeep.P99, s.HandoffDeep.Max, s.HandoffDeep.Count, s.HandoffDeep.Depth, s.UpstreamMaxFlow,
		s.HandoffDeep.CPULine())
	return nil
}
