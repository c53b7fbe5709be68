package bench

// The scale scenario's targets and its section of the report.

import (
	"cmp"
	"fmt"
	"slices"
	"strings"

	"github.com/fair-queue/caddy-fair-queue/bench/internal/procs"
)

// Targets of the scale scenario (the idle Redis load shares TargetIdle).
const (
	TargetScaleMem      = "50,000 waiters: <= 50 KiB each (1 KiB prompts; Caddy procs.RSS + Redis used_memory)"
	TargetScaleHandoff  = "handoff p99 with 50,000 waiting no worse than with 100 (<= max(1.25x, +1 ms))"
	TargetScaleFailures = "scale: no waiter failed, was rejected or not sent"
	TargetScaleQueues   = "100 queues on one Redis: idle load and memory, reported"
)

// scaleTargetWaiters is the queue depth the memory target asks for.
const scaleTargetWaiters = 50_000

// perWaiterKiB is the memory per waiter the target counts: Caddy's procs.RSS
// and Redis' used_memory.
func (s *Scale) perWaiterKiB() float64 { return s.RSSPerWaiterKiB + s.RedisPerWaiterKiB }

// handoffOK reports whether deep's p99 is within the tolerance of
// base's: at most tolerance times it, or slack ms more, whichever is
// larger.
func handoffOK(base, deep, tolerance, slackMS float64) bool {
	return deep <= max(base*tolerance, base+slackMS)
}

// scaleChecks are the targets of the scale scenario.
func scaleChecks(s *Scale, permits int) []Check {
	if s == nil {
		return nil
	}
	var checks []Check
	add := func(target, system, value, result string) {
		checks = append(checks, Check{Target: target, System: system, Value: value, Result: result})
	}
	set := s.Settings
	name := fmt.Sprintf("fq-redis-%d scale (%d waiters)", set.Nodes, set.Waiters)
	if s.Queued <= 0 {
		add(TargetScaleMem, name, "not measured: "+oneLine(s.Note, 200), "FAIL")
	} else {
		value := fmt.Sprintf("%.2f KiB per waiter: Caddy procs.RSS %.2f KiB (%d nodes, %.1f -> %.1f MiB) + Redis %.2f KiB (%.1f -> %.1f MiB); %d waiting",
			s.perWaiterKiB(), s.RSSPerWaiterKiB, set.Nodes, mib(s.RSSBefore), mib(s.RSSAfter),
			s.RedisPerWaiterKiB, mib(s.RedisMemBefore), mib(s.RedisMemAfter), s.Queued)
		ok := s.perWaiterKiB() <= 50
		if s.Queued < scaleTargetWaiters {
			value += fmt.Sprintf(" (short of %d)", scaleTargetWaiters)
			if s.Note != "" {
				value += ": " + oneLine(s.Note, 160)
			}
			ok = false
		}
		add(TargetScaleMem, name, value, verdict(ok))
		ok = s.IdleCmdsPerS <= 1.5*s.BaseCmdsPerS+2
		add(TargetIdle, name, fmt.Sprintf("%.1f cmds/s (%.1f scripts/s) with %d waiting vs %.1f (%.1f) with %d, over %.0f s (calls: %s)",
			s.IdleCmdsPerS, s.IdleScriptsPerS, s.Queued, s.BaseCmdsPerS, s.BaseScriptsPerS, set.BaseWaiters, set.IdleWindowS,
			topCommands(s.IdleCommands, 5)), verdict(ok))
	}
	switch {
	case s.HandoffBase == nil || s.HandoffDeep == nil || s.HandoffBase.Count == 0 || s.HandoffDeep.Count == 0:
		add(TargetScaleHandoff, name, "not measured: "+oneLine(s.Note, 200), "FAIL")
	default:
		b, d := s.HandoffBase, s.HandoffDeep
		add(TargetScaleHandoff, name, fmt.Sprintf("p99 %.3f vs %.3f ms (p50 %.3f vs %.3f; %d and %d handoffs, depth %d and %d when read)",
			d.P99, b.P99, d.P50, b.P50, d.Count, b.Count, d.Depth, b.Depth),
			verdict(handoffOK(b.P99, d.P99, set.HandoffTolerance, set.HandoffSlackMS)))
	}
	if s.Queued > 0 {
		add(TargetConcurrency, name, fmt.Sprintf("%d while held, %d while draining, vs %d (%d waiters served while every permit was held)",
			s.UpstreamMaxHeld, s.UpstreamMaxFlow, permits, s.Served),
			verdict(s.Served == 0 && s.UpstreamMaxHeld <= permits && s.UpstreamMaxFlow <= permits))
		add(TargetScaleFailures, name, fmt.Sprintf("%d failed, %d rejected, %d not sent%s%s", s.Failed, s.Rejected, s.Dropped,
			reasonsNote(s.Reasons), errorsNote(s.Errors)),
			verdict(s.Failed+s.Rejected+s.Dropped == 0))
	}
	if q := s.Queues; q != nil {
		qname := fmt.Sprintf("fq-redis-1 (%d queues)", q.Queues)
		if q.Queues < set.Queues || q.Note != "" {
			add(TargetScaleQueues, qname, "not measured in full: "+oneLine(q.Note, 200), "FAIL")
		}
		if q.Queues > 1 {
			add(TargetScaleQueues, qname, fmt.Sprintf("%.1f cmds/s idle vs %.1f with 1 queue (%s); Redis %+.1f KiB vs %+.1f KiB (%.2f KiB per added queue); %d waiting, %d served while held, %d failed, %d rejected",
				q.ManyCmdsPerS, q.OneCmdsPerS, topCommands(q.ManyCommands, 4), kib(q.ManyMem), kib(q.OneMem), q.perQueueKiB(), q.Waiting, q.Served, q.Failed, q.Rejected),
				reportedVerdict(q.Served == 0 && q.Failed+q.Rejected == 0))
		}
	}
	return checks
}

// reportedVerdict is "n/a" for a figure only reported, "FAIL" when the
// run behind it went wrong.
func reportedVerdict(ok bool) string {
	if ok {
		return "n/a"
	}
	return "FAIL"
}

func reasonsNote(r map[string]int) string {
	if len(r) == 0 {
		return ""
	}
	return fmt.Sprintf(" (rejects over the run: %v)", r)
}

// perQueueKiB is the Redis memory each queue beyond the first added.
func (q *ScaleQueues) perQueueKiB() float64 {
	if q.Queues <= 1 {
		return 0
	}
	return kib(q.ManyMem-q.OneMem) / float64(q.Queues-1)
}

// topCommands names the n commands called most, with their counts:
// "evalsha 120, zcard 40".
func topCommands(cs procs.CommandStats, n int) string {
	type kv struct {
		name  string
		calls int64
	}
	var all []kv
	for name, calls := range cs {
		if name != "info" && name != "config" && name != "config|resetstat" {
			all = append(all, kv{name, calls})
		}
	}
	slices.SortFunc(all, func(a, b kv) int {
		if a.calls != b.calls {
			return cmp.Compare(b.calls, a.calls)
		}
		return strings.Compare(a.name, b.name)
	})
	parts := make([]string, 0, n)
	for _, c := range all[:min(n, len(all))] {
		parts = append(parts, fmt.Sprintf("%s %d", c.name, c.calls))
	}
	if len(parts) == 0 {
		return "no command"
	}
	return strings.Join(parts, ", ")
}

func errorsNote(e map[string]int) string {
	if len(e) == 0 {
		return ""
	}
	return fmt.Sprintf(" (errors: %v)", e)
}

func mib(n int64) float64 { return float64(n) / (1 << 20) }

func kib(n int64) float64 { return float64(n) / 1024 }

// scaleMarkdown writes the scenario's section of the report.
func scaleMarkdown(b *strings.Builder, s *Scale) {
	if s == nil {
		return
	}
	w := func(format string, args ...any) { fmt.Fprintf(b, format, args...) }
	set := s.Settings
	w("\n## Scale: %d waiters over %d nodes, %d queues on one Redis\n\n", set.Waiters, set.Nodes, set.Queues)
	w("%s. Every permit is held by a stream that lasts minutes, then %d streams with %s prompts queue behind them,\n",
		s.System, set.Waiters, sizeLabel(set.PromptBytes))
	w("%.0f/s in all, from %d client processes (the bench re-executed with `-scale-client`; each holds at most %d\n",
		set.RampRPS, set.ClientProcs, set.FDLimit-set.FDReserve)
	w("connections under the open-file limit of %d, raised soft to hard; each talks to one node). Memory per waiter is\n", set.FDLimit)
	w("the growth of the %d nodes' VmRSS summed, and of Redis' `used_memory`, from %d to all of them waiting, per waiter.\n",
		set.Nodes, set.BaseWaiters)
	w("Idle Redis load: every command over %.0f s (INFO commandstats) with nobody moving. Handoffs are the gaps from an\n", set.IdleWindowS)
	w("upstream completion's end to the arrival of the request that took its permit (mockllm timeline) over %.0f s:\n", set.HandoffWindowS)
	w("with %d always waiting (a closed loop of %d streams), and while the deep queue drains once the permits are\n", set.BaseWaiters, set.BaseWaiters+set.Permits)
	w("released. The deep queue passes if its p99 is at most max(%.2fx, +%.0f ms) the shallow one's.\n\n", set.HandoffTolerance, set.HandoffSlackMS)
	w("| waiting | Caddy procs.RSS MiB (%d nodes) | Redis used_memory MiB | Redis cmds/s idle | scripts/s idle | handoff p50 ms | p90 ms | p99 ms | max ms | handoffs |\n|---|---|---|---|---|---|---|---|---|---|\n", set.Nodes)
	hf := func(h *Handoffs) string {
		if h == nil {
			return "| | | | |"
		}
		return fmt.Sprintf("%.3f | %.3f | %.3f | %.3f | %d", h.P50, h.P90, h.P99, h.Max, h.Count)
	}
	w("| %d | %.1f | %.1f | %.1f | %.1f | %s |\n", set.BaseWaiters, mib(s.RSSBefore), mib(s.RedisMemBefore), s.BaseCmdsPerS, s.BaseScriptsPerS, hf(s.HandoffBase))
	w("| %d | %.1f | %.1f | %.1f | %.1f | %s |\n", s.Queued+int64(set.BaseWaiters), mib(s.RSSAfter), mib(s.RedisMemAfter), s.IdleCmdsPerS, s.IdleScriptsPerS, hf(s.HandoffDeep))
	if s.HandoffBase != nil && s.HandoffDeep != nil {
		w("\nCPU over the handoff windows (the Redis round trip is a no-op script call from the bench every ms, to tell\n")
		w("a stalled Redis from a stalled node): with %d waiting %s; with %d waiting %s.\n",
			set.BaseWaiters, s.HandoffBase.cpuLine(), s.Queued, s.HandoffDeep.cpuLine())
	}
	w("\nPer waiter: Caddy %.2f KiB, Redis %.2f KiB, %.2f KiB in all. While every permit was held: upstream max %d (permits %d),\n",
		s.RSSPerWaiterKiB, s.RedisPerWaiterKiB, s.perWaiterKiB(), s.UpstreamMaxHeld, set.Permits)
	w("%d waiters served, %d failed, %d rejected, %d not sent; upstream max while draining %d.", s.Served, s.Failed, s.Rejected, s.Dropped, s.UpstreamMaxFlow)
	if len(s.Errors) > 0 {
		w(" Client errors: %v.", s.Errors)
	}
	if len(s.IdleCommands) > 0 {
		w(" Commands over the idle window with all waiting: %s.", topCommands(s.IdleCommands, 6))
	}
	if s.Note != "" {
		w(" Note: %s", oneLine(s.Note, 300))
	}
	w("\n")
	if q := s.Queues; q != nil {
		w("\n%d queues on one node and one Redis: one handler whose `name` is `{http.request.header.X-Queue}` (a handler opens\n", q.Queues)
		w("at most 100), each queue with its %d permits held and %d waiters. Memory is the growth of `used_memory` over the\n", set.QueuePermits, set.QueueWaiters)
		w("node with no queue open; `used_memory` also moves with Redis' own buffers, which shrink after the deep run (the\n")
		w("first row can come out negative), so the figure per queue added is the difference between the two rows.\n\n")
		w("| queues | waiting | Redis cmds/s idle | Redis used_memory KiB | Caddy procs.RSS MiB |\n|---|---|---|---|---|\n")
		w("| 1 | %d | %.1f | %+.1f | %.1f |\n", set.QueueWaiters, q.OneCmdsPerS, kib(q.OneMem), mib(q.RSSOne))
		if q.Queues > 1 {
			w("| %d | %d | %.1f | %+.1f | %.1f |\n", q.Queues, q.Waiting, q.ManyCmdsPerS, kib(q.ManyMem), mib(q.RSSMany))
			w("\nPer queue added: %.2f KiB of Redis memory, %.1f Redis cmds/s idle. Commands over the idle window with %d queues: %s.\n",
				q.perQueueKiB(), (q.ManyCmdsPerS-q.OneCmdsPerS)/float64(q.Queues-1), q.Queues, topCommands(q.ManyCommands, 6))
		}
		if q.Note != "" {
			w("\nNote: %s\n", oneLine(q.Note, 300))
		}
	}
}
