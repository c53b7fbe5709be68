package bench

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
	"github.com/fair-queue/caddy-fair-queue/bench/internal/systems"
	"github.com/fair-queue/caddy-fair-queue/internal/loadgen"
)

// runScale runs the scale scenario: the deep queue, then the many
// queues.
func (b *bench) runScale(ctx context.Context) {
	set := report.DefaultScaleSettings(b.opts.ScaleWaiters, fileLimit())
	set.Permits = b.env.Permits
	if b.opts.ScaleRPS > 0 {
		set.RampRPS = b.opts.ScaleRPS
	}
	s := &report.Scale{Settings: set}
	b.res.Scale = s
	env := *b.env
	env.MaxWait = 30 * time.Minute // the deep queue drains for minutes
	spec := systems.Spec{Name: "fq-scale", Label: "fair_queue Redis 3 nodes (scale)", Kind: systems.KindFairQueue, Nodes: set.Nodes, Redis: true}
	s.System = fmt.Sprintf("fair_queue Redis %d nodes, one queue, %d permits", set.Nodes, env.Permits)
	b.logf("== scale: %d waiters over %d nodes from %d client processes at %.0f/s, %s prompts (open-file limit %d)",
		set.Waiters, set.Nodes, set.ClientProcs, set.RampRPS, report.SizeLabel(set.PromptBytes), set.FDLimit)
	if err := b.scaleDeep(ctx, &env, spec, s); err != nil {
		s.Note = strings.TrimSpace(s.Note + " " + err.Error())
		b.logf("   deep queue: %v", err)
	}
	if ctx.Err() != nil {
		return
	}
	q, err := b.scaleQueues(ctx, &env, set)
	if err != nil {
		q.Note = strings.TrimSpace(q.Note + " " + err.Error())
		b.logf("   %d queues: %v", set.Queues, err)
	}
	s.Queues = q
}

// scaleDeep measures the deep queue of one queue over set.Nodes nodes.
func (b *bench) scaleDeep(ctx context.Context, env *systems.Env, spec systems.Spec, s *report.Scale) error {
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
	var loads []*background
	var clients []*procs.Proc
	defer func() {
		var wg sync.WaitGroup
		for _, p := range clients {
			wg.Go(func() { env.Procs.Stop(p) })
		}
		for _, bg := range loads {
			wg.Go(bg.stop)
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
					s.Errors[genericError(msg)] += n
				}
			}
		}
	}()
	if err := b.warm(ctx, r); err != nil {
		return err
	}
	depth := func() int64 {
		d := b.queueDepth(ctx, r.Queue)
		s.MaxDepth = max(s.MaxDepth, d)
		return d
	}

	// Handoffs with BaseWaiters always waiting: a closed loop of
	// permits + BaseWaiters short streams.
	base, err := startLoad(ctx, loadgen.Config{
		Targets: r.Targets, Clients: permits + set.BaseWaiters, Duration: report.Secs(set.HandoffWindowS + 3),
		Stream: true, Tokens: 1, Delay: 10 * time.Millisecond, PromptBytes: set.PromptBytes, Timeout: time.Minute,
	})
	if err != nil {
		return err
	}
	if err := sleepCtx(ctx, 1500*time.Millisecond); err != nil {
		return err
	}
	if err := b.resetMock(ctx); err != nil {
		return err
	}
	win := startCPUWindow(r.PIDs(), b.redisPID, nil)
	var probe report.Handoffs
	probed := b.probeRedis(ctx, report.Secs(set.HandoffWindowS), &probe)
	if err := sleepCtx(ctx, report.Secs(set.HandoffWindowS)); err != nil {
		return err
	}
	s.HandoffBase, _, err = b.handoffs(ctx)
	if err != nil {
		return err
	}
	win.end(s.HandoffBase, r.PIDs(), b.redisPID, nil)
	s.HandoffBase.Depth = depth()
	<-probed
	s.HandoffBase.RedisRTTP50, s.HandoffBase.RedisRTTP99 = probe.RedisRTTP50, probe.RedisRTTP99
	base.stop()
	b.logf("   handoffs with %d waiting: p50 %.3f ms, p90 %.3f ms, p99 %.3f ms, max %.3f ms (%d, depth %d when read); %s",
		set.BaseWaiters, s.HandoffBase.P50, s.HandoffBase.P90, s.HandoffBase.P99, s.HandoffBase.Max, s.HandoffBase.Count, s.HandoffBase.Depth,
		s.HandoffBase.CPULine())
	if err := sleepCtx(ctx, time.Second); err != nil {
		return err
	}

	// Every permit held, BaseWaiters queued: the shallow idle load.
	if err := b.resetCounters(ctx); err != nil {
		return err
	}
	hold, err := startLoad(ctx, holdConfig(r.Targets, permits, nil))
	if err != nil {
		return err
	}
	loads = append(loads, hold)
	if !waitFor(ctx, 10*time.Second, func() bool {
		st, err := b.mockStats(ctx)
		return err == nil && st.InFlight >= permits
	}) {
		return errors.New("the permits were not all taken within 10s")
	}
	few, err := startLoad(ctx, waitConfig(r.Targets, set.BaseWaiters, set.PromptBytes, 1000, nil))
	if err != nil {
		return err
	}
	loads = append(loads, few)
	if !waitFor(ctx, 30*time.Second, func() bool { return depth() >= int64(set.BaseWaiters) }) {
		return fmt.Errorf("only %d of %d base waiters queued", depth(), set.BaseWaiters)
	}
	if err := sleepCtx(ctx, time.Second); err != nil {
		return err
	}
	if s.BaseCmdsPerS, s.BaseScriptsPerS, _, err = b.idleOver(ctx, report.Secs(set.IdleWindowS)); err != nil {
		return err
	}
	if s.RSSBefore, err = rssSum(r.PIDs()); err != nil {
		return err
	}
	if s.RedisMemBefore, err = b.redisUsedMemory(ctx); err != nil {
		return err
	}
	b.logf("   %d waiting: Redis %.1f cmds/s idle (%.1f scripts/s), RSS %.1f MiB (3 nodes), Redis used_memory %.1f MiB",
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
			b.logf("   queueing: depth %d of %d after %.0f s", d, want, time.Since(start).Seconds())
		}
		if err := sleepCtx(ctx, 250*time.Millisecond); err != nil {
			return err
		}
	}
	if err := sleepCtx(ctx, 3*time.Second); err != nil { // settle: bodies read, goroutines parked
		return err
	}
	s.Queued = max(depth()-int64(set.BaseWaiters), 0)
	if stall != nil {
		s.Note = stall.Error()
		b.logf("   %v", stall)
	}
	b.logf("   %d waiting after %.0f s", s.Queued, time.Since(start).Seconds())
	if s.RSSAfter, err = rssSum(r.PIDs()); err != nil {
		return err
	}
	if s.RedisMemAfter, err = b.redisUsedMemory(ctx); err != nil {
		return err
	}
	if s.Queued > 0 {
		s.RSSPerWaiterKiB = report.Round(float64(s.RSSAfter-s.RSSBefore)/1024/float64(s.Queued), 2)
		s.RedisPerWaiterKiB = report.Round(float64(s.RedisMemAfter-s.RedisMemBefore)/1024/float64(s.Queued), 2)
	}
	if s.IdleCmdsPerS, s.IdleScriptsPerS, s.IdleCommands, err = b.idleOver(ctx, report.Secs(set.IdleWindowS)); err != nil {
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
	fc := few.r.Counters()
	s.Served += fc.Granted.Load()
	s.Failed += fc.Failed.Load()
	s.Rejected += fc.Rejected.Load()
	if st, err := b.mockStats(ctx); err == nil {
		s.UpstreamMaxHeld = st.MaxInFlight
	}
	b.logf("   %d waiting: RSS %.1f -> %.1f MiB = %.2f KiB per waiter; Redis %.1f -> %.1f MiB = %.2f KiB per waiter; Redis %.1f cmds/s idle (%.1f with %d); served %d, failed %d, rejected %d, dropped %d, upstream max %d",
		s.Queued, float64(s.RSSBefore)/(1<<20), float64(s.RSSAfter)/(1<<20), s.RSSPerWaiterKiB,
		float64(s.RedisMemBefore)/(1<<20), float64(s.RedisMemAfter)/(1<<20), s.RedisPerWaiterKiB,
		s.IdleCmdsPerS, s.BaseCmdsPerS, set.BaseWaiters, s.Served, s.Failed, s.Rejected, s.Dropped, s.UpstreamMaxHeld)

	// Release the permits: the queue drains, still deep.
	hold.stop()
	if err := sleepCtx(ctx, time.Second); err != nil {
		return err
	}
	if err := b.resetMock(ctx); err != nil {
		return err
	}
	win = startCPUWindow(r.PIDs(), b.redisPID, procPIDs(clients))
	probe = report.Handoffs{}
	probed = b.probeRedis(ctx, report.Secs(set.HandoffWindowS), &probe)
	if err := sleepCtx(ctx, report.Secs(set.HandoffWindowS)); err != nil {
		return err
	}
	s.HandoffDeep, s.UpstreamMaxFlow, err = b.handoffs(ctx)
	if err != nil {
		return err
	}
	win.end(s.HandoffDeep, r.PIDs(), b.redisPID, procPIDs(clients))
	s.HandoffDeep.Depth = depth()
	<-probed
	s.HandoffDeep.RedisRTTP50, s.HandoffDeep.RedisRTTP99 = probe.RedisRTTP50, probe.RedisRTTP99
	b.logf("   handoffs with %d waiting: p50 %.3f ms, p90 %.3f ms, p99 %.3f ms, max %.3f ms (%d, depth %d when read), upstream max %d; %s",
		s.Queued, s.HandoffDeep.P50, s.HandoffDeep.P90, s.HandoffDeep.P99, s.HandoffDeep.Max, s.HandoffDeep.Count, s.HandoffDeep.Depth, s.UpstreamMaxFlow,
		s.HandoffDeep.CPULine())
	return nil
}
