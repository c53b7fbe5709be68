package report

import (
	"fmt"
	"slices"

	"github.com/fair-queue/caddy-fair-queue/bench/internal/systems"
)

// Targets of the benchmark issue.
const (
	TargetThroughput   = "saturated throughput vs HAProxy: local >= 1.00x, Redis 1 node >= 0.97x, 3 nodes >= 0.95x"
	TargetShort        = "saturated throughput vs HAProxy, short service: local >= 0.98x, Redis 1 node >= 0.92x (3 nodes reported)"
	TargetHandoffRatio = "handoff p50 vs HAProxy's: local <= 1.5x, Redis <= 2.5x"
	TargetFastPath     = "fast path <= +0.2 ms p50 over reverse_proxy"
	TargetCPU          = "fair_queue adds at most 15% CPU per request over plain reverse_proxy"
	TargetHandoff      = "handoff p99 <= 2 ms"
	TargetFastScripts  = "<= 2 Redis script calls per fast-path request"
	TargetQueueScripts = "<= 3 Redis script calls per queued request"
	TargetConcurrency  = "upstream max concurrency <= permits"
	TargetRSS          = "<= 50 KB RSS per waiting connection (1 KiB prompt)"
	TargetRSS64        = "RSS per waiting connection (64 KiB prompt), reported"
	TargetIdle         = "idle Redis load independent of the number of waiters"
)

func verdict(ok bool) string {
	if ok {
		return "pass"
	}
	return "FAIL"
}

// Evaluate compares the measurements with the targets, one check per
// target and system it applies to.
func Evaluate(res *Results) []Check {
	var checks []Check
	add := func(target, system, value, result string) {
		checks = append(checks, Check{Target: target, System: system, Value: value, Result: result})
	}
	ha := res.System("haproxy")
	permits := res.Settings.Permits
	for _, s := range res.Systems {
		if s.Error != "" || !s.Spec.Limited() {
			continue
		}
		name := s.Spec.Name
		fq := s.Spec.Kind == systems.KindFairQueue
		if fq && s.Saturated != nil {
			if ha != nil && ha.Saturated != nil && ha.Saturated.Throughput > 0 {
				r := s.Saturated.Throughput / ha.Saturated.Throughput
				add(TargetThroughput, name, fmt.Sprintf("%.1f vs %.1f req/s = %.3fx", s.Saturated.Throughput, ha.Saturated.Throughput, r), verdict(r >= throughputTarget(s.Spec)))
			} else {
				add(TargetThroughput, name, fmt.Sprintf("%.1f req/s (no HAProxy run)", s.Saturated.Throughput), "n/a")
			}
		}
		if fq && s.SaturatedShort != nil {
			value, result := shortThroughput(res, s)
			add(TargetShort, name, value, result)
		}
		if fq {
			checks = append(checks, handoffRatioChecks(res, s)...)
		}
		if base := res.baseline(s); fq && s.LowLoad != nil && base != nil {
			d50 := s.LowLoad.P50 - base.LowLoad.P50
			d99 := s.LowLoad.P99 - base.LowLoad.P99
			add(TargetFastPath, name, fmt.Sprintf("p50 %+.3f ms, p99 %+.3f ms (%.3f / %.3f ms vs %.3f / %.3f, %s)",
				d50, d99, s.LowLoad.P50, s.LowLoad.P99, base.LowLoad.P50, base.LowLoad.P99, base.Spec.Label), verdict(d50 <= 0.2))
		}
		if fq {
			for _, l := range cpuLoads {
				if c, ok := cpuCheck(res, s, l.name, l.pick, l.ref); ok {
					if l.reported && c.Result != "n/a" {
						c.Result = "reported"
					}
					checks = append(checks, c)
				}
			}
		}
		if s.Saturated != nil && s.Saturated.HandoffCount > 0 {
			add(TargetHandoff, name, fmt.Sprintf("p50 %.3f ms, p99 %.3f ms (%d handoffs)",
				s.Saturated.HandoffP50, s.Saturated.HandoffP99, s.Saturated.HandoffCount), verdict(s.Saturated.HandoffP99 <= 2))
		}
		if s.Spec.Redis && s.LowLoad != nil {
			add(TargetFastScripts, name, fmt.Sprintf("%.2f scripts, %.2f commands (inside scripts too) per request",
				s.LowLoad.ScriptsPerRequest, s.LowLoad.CommandsPerRequest), verdict(s.LowLoad.ScriptsPerRequest <= 2))
		}
		if s.Spec.Redis && s.Saturated != nil {
			add(TargetQueueScripts, name, fmt.Sprintf("%.2f scripts, %.2f commands (inside scripts too) per request",
				s.Saturated.ScriptsPerRequest, s.Saturated.CommandsPerRequest), verdict(s.Saturated.ScriptsPerRequest <= 3))
		}
		for i, run := range []*LoadRun{s.Saturated, s.SaturatedStream} {
			if run != nil {
				label := name
				if i == 1 {
					label += " (streamed)"
				}
				add(TargetConcurrency, label, fmt.Sprintf("%d vs %d", run.UpstreamMax, permits), verdict(run.UpstreamMax <= permits))
			}
		}
	}
	for _, w := range res.Waiters {
		target := TargetRSS64
		if w.PromptBytes == 1<<10 {
			target = TargetRSS
		}
		name := fmt.Sprintf("%s (%d waiters, %s prompts, at %.0f/s)", w.System, w.Waiters, SizeLabel(w.PromptBytes), w.RampRPS)
		if w.UpstreamMax > 0 {
			add(TargetConcurrency, name, fmt.Sprintf("%d vs %d (%d waiters served, %d failed while the permits were held)",
				w.UpstreamMax, permits, w.Served, w.Failed), verdict(w.UpstreamMax <= permits))
		}
		if w.Burst {
			continue
		}
		if w.Note != "" || w.Queued <= 0 {
			result := "n/a"
			if target == TargetRSS {
				result = "FAIL"
			}
			add(target, name, "not measured: "+w.Note, result)
			continue
		}
		value := fmt.Sprintf("%.1f KiB per waiter (%d waiting, RSS %.1f -> %.1f MiB)",
			w.RSSPerWaiter, w.Queued, float64(w.RSSBefore)/(1<<20), float64(w.RSSAfter)/(1<<20))
		if target == TargetRSS {
			add(TargetRSS, name, value, verdict(w.RSSPerWaiter*1024 <= 50_000))
		} else {
			add(TargetRSS64, name, value, "n/a")
		}
		if w.BaseWaiters > 0 {
			ok := w.IdleCmdsPerS <= 1.5*w.BaseCmdsPerS+2
			add(TargetIdle, name, fmt.Sprintf("%.1f cmds/s with %d waiting vs %.1f with %d",
				w.IdleCmdsPerS, w.Queued, w.BaseCmdsPerS, w.BaseWaiters), verdict(ok))
		}
	}
	checks = append(checks, configChecks(res.Configs)...)
	checks = append(checks, fairnessChecks(res.Fairness)...)
	checks = append(checks, llmChecks(res.LLM)...)
	checks = append(checks, scaleChecks(res.Scale, permits)...)
	checks = append(checks, capacityChecks(res.Capacity)...)
	// One block per target, in the order of the issue.
	order := []string{TargetThroughput, TargetShort, TargetFastPath, TargetCPU, TargetHandoff, TargetHandoffRatio, TargetFastScripts,
		TargetQueueScripts, TargetConcurrency, TargetLLMUtil, TargetLLMWait, TargetRSS, TargetRSS64, TargetIdle,
		TargetScaleMem, TargetScaleHandoff, TargetScaleFailures, TargetScaleQueues, TargetFairTime, TargetFairTokens}
	slices.SortStableFunc(checks, func(a, b Check) int {
		return slices.Index(order, a.Target) - slices.Index(order, b.Target)
	})
	return checks
}

// throughputTarget is the least saturated throughput over HAProxy's that
// fair_queue system spec must reach: 1.00x with the local store, 0.97x
// with Redis on one node, 0.95x on more (a grant to another node is a
// Pub/Sub message more).
func throughputTarget(spec systems.Spec) float64 {
	switch {
	case !spec.Redis:
		return 1.00
	case spec.Nodes == 1:
		return 0.97
	}
	return 0.95
}

// shortThroughput compares the short-service saturated throughput of
// fair_queue system s with HAProxy's: its value and result.
func shortThroughput(res *Results, s *System) (value, result string) {
	ha := res.System("haproxy")
	run := s.SaturatedShort
	if ha == nil || ha.SaturatedShort == nil || ha.SaturatedShort.Throughput <= 0 {
		return fmt.Sprintf("%.1f req/s (no HAProxy run)", run.Throughput), "n/a"
	}
	r := run.Throughput / ha.SaturatedShort.Throughput
	value = fmt.Sprintf("%.1f vs %.1f req/s = %.3fx (%g ms upstream)", run.Throughput, ha.SaturatedShort.Throughput, r, res.Settings.ShortServiceMS)
	target, checked := shortThroughputTarget(s.Spec)
	if !checked {
		return value, "reported"
	}
	return value, verdict(r >= target)
}

// shortThroughputTarget is the least short-service saturated throughput
// over HAProxy's that fair_queue system spec must reach: 0.98x with the
// local store, 0.92x with Redis on one node; none on more (reported).
func shortThroughputTarget(spec systems.Spec) (float64, bool) {
	switch {
	case !spec.Redis:
		return 0.98, true
	case spec.Nodes == 1:
		return 0.92, true
	}
	return 0, false
}

// handoffRatioChecks compare the handoff p50 of fair_queue system s with
// HAProxy's under each saturated load both ran: at most 1.5x with the
// local store, 2.5x with Redis (a script call and a Pub/Sub message more).
func handoffRatioChecks(res *Results, s *System) []Check {
	ha := res.System("haproxy")
	if ha == nil {
		return nil
	}
	limit := 1.5
	if s.Spec.Redis {
		limit = 2.5
	}
	var checks []Check
	for _, l := range saturatedLoads(res.Settings) {
		run, ref := l.pick(s), l.pick(ha)
		if run == nil || ref == nil || run.HandoffCount == 0 || ref.HandoffCount == 0 || ref.HandoffP50 <= 0 {
			continue
		}
		r := run.HandoffP50 / ref.HandoffP50
		checks = append(checks, Check{
			Target: TargetHandoffRatio, System: fmt.Sprintf("%s (%g ms)", s.Spec.Name, l.serviceMS),
			Value:  fmt.Sprintf("p50 %.3f vs %.3f ms = %.2fx", run.HandoffP50, ref.HandoffP50, r),
			Result: verdict(Round(r, 3) <= limit),
		})
	}
	return checks
}

// saturatedLoad is one of the saturated loads, by its service time.
type saturatedLoad struct {
	serviceMS float64
	pick      func(*System) *LoadRun
	// upstreamQueues picks plain reverse_proxy's load of the same
	// service time against an upstream that queues itself.
	upstreamQueues func(*System) *LoadRun
}

// saturatedLoads are the saturated loads of a run's settings: ServiceMS,
// then ShortServiceMS when the run had it.
func saturatedLoads(set Settings) []saturatedLoad {
	loads := []saturatedLoad{{set.ServiceMS, pickSaturated, pickUpstreamQueues}}
	if set.ShortServiceMS > 0 {
		loads = append(loads, saturatedLoad{set.ShortServiceMS, pickSaturatedShort, pickUpstreamQueuesShort})
	}
	return loads
}

// median returns the median of vs (the mean of the middle two when even);
// 0 when empty.
func median(vs []float64) float64 {
	if len(vs) == 0 {
		return 0
	}
	s := slices.Clone(vs)
	slices.Sort(s)
	if n := len(s); n%2 == 0 {
		return (s[n/2-1] + s[n/2]) / 2
	}
	return s[len(s)/2]
}

// SizeLabel writes a prompt size: "1 KiB", "64 KiB", or bytes.
func SizeLabel(n int) string {
	if n >= 1<<10 && n%(1<<10) == 0 {
		return fmt.Sprintf("%d KiB", n>>10)
	}
	return fmt.Sprintf("%d B", n)
}

// cpuLoads are the loads whose CPU per request is checked, and the load
// of plain reverse_proxy each is compared with: the same load at low
// load; when saturated, the same load against an upstream that queues
// itself (UpstreamQueues): the same clients and client connections, upstream
// concurrency and about the same throughput, with the queue in the
// upstream. Reported beside it, not checked: reverse_proxy with as many
// clients as permits (AtPermits), the earlier reference, which has no
// waiting clients at all.
var cpuLoads = []struct {
	name      string
	pick, ref func(*System) *LoadRun
	reported  bool
}{
	{"low load", pickLowLoad, pickLowLoad, false},
	{"saturated", pickSaturated, pickUpstreamQueues, false},
	{"saturated, vs no waiting clients", pickSaturated, pickAtPermits, true},
	{"saturated, short service", pickSaturatedShort, pickUpstreamQueuesShort, true},
}

func pickLowLoad(s *System) *LoadRun { return s.LowLoad }

func pickSaturated(s *System) *LoadRun { return s.Saturated }

func pickSaturatedShort(s *System) *LoadRun { return s.SaturatedShort }

func pickUpstreamQueuesShort(s *System) *LoadRun { return s.UpstreamQueuesShort }

func pickAtPermits(s *System) *LoadRun { return s.AtPermits }

func pickUpstreamQueues(s *System) *LoadRun { return s.UpstreamQueues }

// cpuReference returns the plain reverse_proxy system whose load refPick
// a load of s is compared with, on as many nodes when that ran it, else
// on one, and that load; nil when none ran it or refPick is nil.
func cpuReference(res *Results, s *System, refPick func(*System) *LoadRun) (base *System, ref *LoadRun) {
	if refPick == nil {
		return nil, nil
	}
	if base = res.baselineFor(s, refPick); base != nil {
		ref = refPick(base)
	}
	return base, ref
}

// cpuCheck compares the proxy CPU per request of s under one load with
// plain reverse_proxy's (cpuReference), on as many nodes when that ran,
// else on one; proxy+Redis is reported beside it. ok is false when s did
// not run the load or its CPU was not measured.
func cpuCheck(res *Results, s *System, load string, pick, refPick func(*System) *LoadRun) (Check, bool) {
	run := pick(s)
	if run == nil || run.ProxyCPUPerRequest <= 0 {
		return Check{}, false
	}
	c := Check{Target: TargetCPU, System: s.Spec.Name + " (" + load + ")"}
	base, ref := cpuReference(res, s, refPick)
	if ref == nil || ref.ProxyCPUPerRequest <= 0 {
		c.Value = fmt.Sprintf("proxy %.4f ms/req, proxy+Redis %.4f ms/req (no reverse_proxy CPU to compare with)",
			run.ProxyCPUPerRequest, run.TotalCPUPerRequest())
		c.Result = "n/a"
		return c, true
	}
	r := run.ProxyCPUPerRequest / ref.ProxyCPUPerRequest
	c.Value = fmt.Sprintf("proxy %.4f vs %.4f ms/req = %.2fx; proxy+Redis %.4f ms/req = %.2fx (%s; %.0f vs %.0f req/s)",
		run.ProxyCPUPerRequest, ref.ProxyCPUPerRequest, r, run.TotalCPUPerRequest(),
		run.TotalCPUPerRequest()/ref.ProxyCPUPerRequest, refLabel(base, ref), run.Throughput, ref.Throughput)
	c.Result = verdict(Round(r, 3) <= 1.15)
	return c, true
}

// refLabel names the reverse_proxy load ref of base.
func refLabel(base *System, ref *LoadRun) string {
	switch ref {
	case base.AtPermits:
		return fmt.Sprintf("%s, as many clients as permits", base.Spec.Label)
	case base.UpstreamQueues:
		return fmt.Sprintf("%s, the upstream queueing", base.Spec.Label)
	}
	return base.Spec.Label
}
