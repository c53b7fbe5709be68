// Package llm runs the LLM-shaped scenario: an open loop of Poisson
// arrivals with LLM-shaped service times, the same plan for every
// system, at fractions of the permits' capacity. Its figures and their
// report are report.LLM.
package llm

import (
	"context"
	"fmt"
	"time"

	"github.com/fair-queue/caddy-fair-queue/bench/internal/report"
	"github.com/fair-queue/caddy-fair-queue/bench/internal/scenario"
	"github.com/fair-queue/caddy-fair-queue/bench/internal/systems"
	"github.com/fair-queue/caddy-fair-queue/internal/loadgen"
)

// The LLM-shaped scenario: an open loop of Poisson arrivals at fractions
// of the capacity of a few permits (an LLM replica's sequences), each
// request streamed for a service time drawn from a log-normal (median
// 1 s, p99 10 s) at 20 ms per token, with a prompt of 1-32 KiB. Every
// system gets the same drawn sequence at each load (one fixed seed per
// load), so they see identical arrivals, sizes and service times; each
// point runs until every request sent is answered (the drain, bounded),
// so the next starts with an empty queue.

// llmSpecs are the systems of the scenario: HAProxy, then fair_queue
// local, Redis 1 node and Redis 3 nodes.
func llmSpecs() []systems.Spec {
	var out []systems.Spec
	for _, s := range systems.DefaultSpecs() {
		if s.Kind == systems.KindHAProxy || (s.Kind == systems.KindFairQueue && !s.BaselineOnly) {
			out = append(out, s)
		}
	}
	return out
}

// Run runs the LLM-shaped scenario on every system of llmSpecs, each
// with the scenario's permits and max_wait.
func Run(ctx context.Context, b *scenario.Runner) {
	set := report.DefaultLLMSettings(b.Quick)
	l := &report.LLM{Settings: set}
	b.Res.LLM = l
	plans := make([]loadgen.Plan, len(set.Loads))
	for i, load := range set.Loads {
		plans[i] = set.Plan(load)
		l.Levels = append(l.Levels, levelOf(set, plans[i]))
	}
	b.Logf("== LLM-shaped load: %d permits, log-normal service (median %.0f ms, p99 %.0f ms) at %.0f ms per token, %.0f s of Poisson arrivals per load",
		set.Permits, set.MedianMS, set.P99MS, set.TokenMS, set.ArrivalsS)
	for _, lv := range l.Levels {
		b.Logf("   load %.2f: %d arrivals at %.2f/s, mean service %.0f ms (model %.0f), longest %.0f ms, work %.0f permit-s (offered load %.3f)",
			lv.Load, lv.Arrivals, lv.Rate, lv.MeanServiceMS, lv.ModelMeanServiceMS, lv.MaxServiceMS, lv.WorkS, lv.Offered)
	}
	env := *b.Env
	env.Permits, env.MaxWait = set.Permits, report.Secs(set.MaxWaitS)
	for _, spec := range llmSpecs() {
		if ctx.Err() != nil {
			return
		}
		l.Systems = append(l.Systems, llmSystem(ctx, b, &env, spec, set, plans))
	}
}

// levelOf describes plan.
func levelOf(set report.LLMSettings, p loadgen.Plan) *report.LLMLevel {
	lv := &report.LLMLevel{
		Load: p.Load, Seed: set.LevelSeed(p.Load), Rate: report.Round(p.Rate, 3), Arrivals: len(p.Arrivals),
		MeanServiceMS: report.MSOf(p.MeanService), ModelMeanServiceMS: report.MSOf(p.MeanServiceModel), WorkS: report.Round(p.Work.Seconds(), 1),
	}
	if p.Duration > 0 && p.Permits > 0 {
		lv.Offered = report.Round(p.Work.Seconds()/(float64(p.Permits)*p.Duration.Seconds()), 3)
	}
	for _, a := range p.Arrivals {
		lv.MaxServiceMS = max(lv.MaxServiceMS, report.MSOf(time.Duration(a.Tokens)*a.Delay))
	}
	if n := len(p.Arrivals); n > 0 {
		lv.LastArrivalS = report.Round(p.Arrivals[n-1].At.Seconds(), 3)
	}
	return lv
}

// llmSystem starts spec (under a name of its own: its logs and its
// queue are not the other scenarios'), runs every load on it and stops
// it.
func llmSystem(ctx context.Context, b *scenario.Runner, env *systems.Env, spec systems.Spec, set report.LLMSettings, plans []loadgen.Plan) *report.LLMSystem {
	sys := &report.LLMSystem{Spec: spec}
	b.Logf("== LLM-shaped load: %s", spec.Label)
	run := spec
	run.Name = "llm-" + spec.Name
	r, err := env.Start(ctx, run)
	if err != nil {
		sys.Error = err.Error()
		b.Logf("   not measured: %v", report.OneLine(err.Error(), 300))
		return sys
	}
	defer env.Stop(r)
	if err := b.Warm(ctx, r); err != nil {
		sys.Error = err.Error()
		return sys
	}
	for _, plan := range plans {
		if ctx.Err() != nil {
			return sys
		}
		p := llmPoint(ctx, b, r, set, plan)
		sys.Points = append(sys.Points, p)
		if p.Error != "" {
			b.Logf("   load %.2f failed: %s", plan.Load, report.OneLine(p.Error, 300))
			continue
		}
		b.Logf("   load %.2f  %4d sent  ok %4d rejected %d failed %d canceled %d  wait p50 %8.1f ms  p99 %8.1f ms  utilization %.3f  upstream max %d  %.1f s (drain %.1f s)",
			p.Load, p.Sent, p.OK, p.Rejected, p.Failed, p.Canceled, p.WaitP50, p.WaitP99, p.Utilization, p.UpstreamMax, p.ElapsedS, p.DrainS)
	}
	return sys
}

// llmPoint runs one load on r: it waits for the upstream to be idle,
// resets the counters, sends the plan's arrivals and waits for their
// answers (up to the drain bound).
func llmPoint(ctx context.Context, b *scenario.Runner, r *systems.Running, set report.LLMSettings, plan loadgen.Plan) *report.LLMPoint {
	p := &report.LLMPoint{Load: plan.Load}
	fail := func(err error) *report.LLMPoint {
		p.Error = err.Error()
		return p
	}
	if err := waitUpstreamIdle(ctx, b, 30*time.Second); err != nil {
		return fail(err)
	}
	if err := b.ResetCounters(ctx); err != nil {
		return fail(err)
	}
	lctx, cancel := context.WithTimeout(ctx, report.Secs(set.ArrivalsS+set.DrainMaxS))
	defer cancel()
	rep, err := b.Load(lctx, r.Targets, loadgen.Config{
		Schedule: plan.Arrivals, Stream: true, Tokens: -1, Delay: -1,
		Timeout: report.Secs(set.MaxWaitS+set.MaxServiceMS/1000) + 30*time.Second,
	})
	if err != nil {
		return fail(err)
	}
	if ctx.Err() != nil {
		return fail(ctx.Err())
	}
	time.Sleep(200 * time.Millisecond) // the last releases
	st, err := b.MockStats(ctx)
	if err != nil {
		return fail(err)
	}
	p.Sent, p.OK, p.Rejected, p.Failed, p.Canceled = rep.Sent, rep.OK, rep.Rejected, rep.Failed, rep.Canceled
	if len(rep.ByReason) > 0 {
		p.Reasons = rep.ByReason
	}
	p.ElapsedS = report.Round(rep.Elapsed, 3)
	if n := len(plan.Arrivals); n > 0 {
		p.DrainS = report.Round(rep.Elapsed-plan.Arrivals[n-1].At.Seconds(), 3)
	}
	p.BusyS = report.Round(st.BusyMS/1000, 3)
	p.Utilization = scenario.Utilization(st.BusyMS, set.Permits, rep.Elapsed)
	p.UpstreamMax, p.UpstreamServed = st.MaxInFlight, st.Served
	w := rep.Overall.TTFB
	p.WaitP50, p.WaitP90, p.WaitP99, p.WaitMax = w.P50, w.P90, w.P99, w.Max
	return p
}

// waitUpstreamIdle waits until mockllm runs no completion (the previous
// point's drained), at most limit.
func waitUpstreamIdle(ctx context.Context, b *scenario.Runner, limit time.Duration) error {
	deadline := time.Now().Add(limit)
	for {
		st, err := b.MockStats(ctx)
		if err != nil {
			return err
		}
		if st.InFlight == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("upstream still runs %d completions after %s", st.InFlight, limit)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}
