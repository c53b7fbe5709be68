package report

// The scale scenario's targets and its section of the report.

import (
	"cmp"
	"fmt"
	"slices"
	"strings"

	"github.com/fair-queue/caddy-fair-queue/bench/internal/procs"
)

// ScaleSettings are the loads of the scale scenario.
type ScaleSettings struct {
	// Waiters is the number of streams queued across Nodes Caddy nodes,
	// by ClientProcs client processes, at RampRPS in all, each with a
	// PromptBytes prompt; BaseWaiters the shallow queue they are
	// compared with.
	Waiters     int     `json:"waiters"`
	Permits     int     `json:"permits"`
	BaseWaiters int     `json:"base_waiters"`
	Nodes       int     `json:"nodes"`
	ClientProcs int     `json:"client_procs"`
	RampRPS     float64 `json:"ramp_rps"`
	PromptBytes int     `json:"prompt_bytes"`
	// FDLimit is the open-file limit of every process (soft raised to
	// hard); FDReserve the descriptors a process keeps for other uses.
	FDLimit   int `json:"fd_limit"`
	FDReserve int `json:"fd_reserve"`
	// IdleWindowS is how long Redis commands are counted while idle;
	// HandoffWindowS how long handoffs are collected while the queue
	// drains.
	IdleWindowS    float64 `json:"idle_window_s"`
	HandoffWindowS float64 `json:"handoff_window_s"`
	// Queues, QueuePermits and QueueWaiters shape the many-queues run:
	// that many queue names on one node and one Redis, each with its
	// permits held and that many waiters.
	Queues       int `json:"queues"`
	QueuePermits int `json:"queue_permits"`
	QueueWaiters int `json:"queue_waiters"`
	// HandoffTolerance and HandoffSlackMS: the deep queue's handoff p99
	// passes when at most max(tolerance x, +slack ms) the shallow one's.
	HandoffTolerance float64 `json:"handoff_tolerance"`
	HandoffSlackMS   float64 `json:"handoff_slack_ms"`
}

// Scale is the outcome of the scale scenario.
type Scale struct {
	Settings ScaleSettings `json:"settings"`
	// System describes the queue; Clients the client processes.
	System  string        `json:"system"`
	Clients []ClientShare `json:"clients,omitempty"`
	// Queued is the depth reached (Redis ZCARD + fair tickets) beyond the
	// BaseWaiters; MaxDepth the deepest seen.
	Queued   int64 `json:"queued"`
	MaxDepth int64 `json:"max_depth"`
	// RSSBefore and RSSAfter are the 3 nodes' VmRSS summed, with the base
	// waiters and with all of them; RSSPerWaiterKiB the delta per waiter.
	RSSBefore       int64   `json:"rss_before_bytes"`
	RSSAfter        int64   `json:"rss_after_bytes"`
	RSSPerWaiterKiB float64 `json:"rss_per_waiter_kib"`
	// RedisMemBefore/After are INFO memory used_memory at the same two
	// moments; RedisPerWaiterKiB the delta per waiter.
	RedisMemBefore    int64   `json:"redis_used_memory_before"`
	RedisMemAfter     int64   `json:"redis_used_memory_after"`
	RedisPerWaiterKiB float64 `json:"redis_per_waiter_kib"`
	// BaseCmdsPerS and IdleCmdsPerS are Redis commands per second, all
	// permits held, with BaseWaiters and with every waiter queued;
	// *ScriptsPerS the script calls among them.
	BaseCmdsPerS    float64 `json:"redis_cmds_per_s_base"`
	BaseScriptsPerS float64 `json:"redis_scripts_per_s_base"`
	IdleCmdsPerS    float64 `json:"redis_cmds_per_s"`
	IdleScriptsPerS float64 `json:"redis_scripts_per_s"`
	// IdleCommands are the calls per command over the deep queue's idle
	// window.
	IdleCommands procs.CommandStats `json:"redis_idle_commands,omitempty"`
	// HandoffBase is measured with BaseWaiters always waiting (a closed
	// loop of permits + BaseWaiters clients), HandoffDeep while the deep
	// queue drains after the permits are released.
	HandoffBase *Handoffs `json:"handoff_base,omitempty"`
	HandoffDeep *Handoffs `json:"handoff_deep,omitempty"`
	// UpstreamMaxHeld is the upstream's highest concurrency while every
	// permit was held; UpstreamMaxFlow while the queue drained.
	UpstreamMaxHeld int `json:"upstream_max_held"`
	UpstreamMaxFlow int `json:"upstream_max_flow"`
	// Served, Failed, Rejected and Dropped count the waiters that got an
	// answer while every permit was held (without a permit), failed,
	// were rejected or not sent, before the release.
	Served   int64 `json:"served_while_held"`
	Failed   int64 `json:"failed"`
	Rejected int64 `json:"rejected"`
	Dropped  int64 `json:"dropped"`
	// Reasons counts rejects by Fair-Queue-Reason over the whole run;
	// Errors the client processes' failures by message (the run's end
	// cancels every request: those are not counted).
	Reasons map[string]int `json:"reasons,omitempty"`
	Errors  map[string]int `json:"errors,omitempty"`
	// Note says what went wrong, if anything: the bound reached.
	Note string `json:"note,omitempty"`
	// Queues is the many-queues run.
	Queues *ScaleQueues `json:"queues,omitempty"`
}

// Handoffs are the gaps from a completion's end to the upstream arrival
// of the request that took its permit (mockllm -timeline), in ms.
type Handoffs struct {
	Count int     `json:"count"`
	P50   float64 `json:"p50_ms"`
	P90   float64 `json:"p90_ms"`
	P99   float64 `json:"p99_ms"`
	Max   float64 `json:"max_ms"`
	// Depth is the queue depth when they were read.
	Depth int64 `json:"depth"`
	// MachineBusy is the share of all CPUs busy over the window
	// (/proc/stat); CaddyCores, RedisCores and ClientCores the CPU the
	// Caddy nodes, redis-server and the client processes used, in cores.
	MachineBusy float64 `json:"machine_busy"`
	CaddyCores  float64 `json:"caddy_cores"`
	RedisCores  float64 `json:"redis_cores"`
	ClientCores float64 `json:"client_cores,omitempty"`
	// RedisRTTP50 and RedisRTTP99 are the round trips of a no-op script
	// call from the bench, one every ms over the window: whether Redis
	// itself stalled.
	RedisRTTP50 float64 `json:"redis_rtt_p50_ms"`
	RedisRTTP99 float64 `json:"redis_rtt_p99_ms"`
}

// ScaleQueues is the many-queues run: one node, one handler naming its
// queue from a header, on one Redis.
type ScaleQueues struct {
	// Queues is how many were opened (Settings.Queues unless it failed).
	Queues int `json:"queues"`
	// OneCmdsPerS and ManyCmdsPerS are the idle Redis commands per second
	// with one queue and with all of them, each holding its permits and
	// waiters; OneMem and ManyMem the used_memory growth over the empty
	// node (bytes).
	OneCmdsPerS  float64 `json:"redis_cmds_per_s_one"`
	ManyCmdsPerS float64 `json:"redis_cmds_per_s_many"`
	OneMem       int64   `json:"redis_mem_one_bytes"`
	ManyMem      int64   `json:"redis_mem_many_bytes"`
	// ManyCommands are the calls per command over the idle window with
	// every queue open.
	ManyCommands procs.CommandStats `json:"redis_idle_commands_many,omitempty"`
	// RSSOne and RSSMany are the node's VmRSS at the same moments.
	RSSOne  int64 `json:"rss_one_bytes"`
	RSSMany int64 `json:"rss_many_bytes"`
	// Waiting is the waiters seen queued over all queues; Served, Failed
	// and Rejected what happened to them while every permit was held.
	Waiting  int64  `json:"waiting"`
	Served   int64  `json:"served_while_held"`
	Failed   int64  `json:"failed"`
	Rejected int64  `json:"rejected"`
	Note     string `json:"note,omitempty"`
}

// Targets of the scale scenario (the idle Redis load shares TargetIdle).
const (
	TargetScaleMem      = "50,000 waiters: <= 50 KiB each (1 KiB prompts; Caddy RSS + Redis used_memory)"
	TargetScaleHandoff  = "handoff p99 with 50,000 waiting no worse than with 100 (<= max(1.25x, +1 ms))"
	TargetScaleFailures = "scale: no waiter failed, was rejected or not sent"
	TargetScaleQueues   = "100 queues on one Redis: idle load and memory, reported"
)

// scaleTargetWaiters is the queue depth the memory target asks for.
const scaleTargetWaiters = 50_000

// perWaiterKiB is the memory per waiter the target counts: Caddy's RSS
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
		add(TargetScaleMem, name, "not measured: "+OneLine(s.Note, 200), "FAIL")
	} else {
		value := fmt.Sprintf("%.2f KiB per waiter: Caddy RSS %.2f KiB (%d nodes, %.1f -> %.1f MiB) + Redis %.2f KiB (%.1f -> %.1f MiB); %d waiting",
			s.perWaiterKiB(), s.RSSPerWaiterKiB, set.Nodes, mib(s.RSSBefore), mib(s.RSSAfter),
			s.RedisPerWaiterKiB, mib(s.RedisMemBefore), mib(s.RedisMemAfter), s.Queued)
		ok := s.perWaiterKiB() <= 50
		if s.Queued < scaleTargetWaiters {
			value += fmt.Sprintf(" (short of %d)", scaleTargetWaiters)
			if s.Note != "" {
				value += ": " + OneLine(s.Note, 160)
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
		add(TargetScaleHandoff, name, "not measured: "+OneLine(s.Note, 200), "FAIL")
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
			add(TargetScaleQueues, qname, "not measured in full: "+OneLine(q.Note, 200), "FAIL")
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
		s.System, set.Waiters, SizeLabel(set.PromptBytes))
	w("%.0f/s in all, from %d client processes (the bench re-executed with `-scale-client`; each holds at most %d\n",
		set.RampRPS, set.ClientProcs, set.FDLimit-set.FDReserve)
	w("connections under the open-file limit of %d, raised soft to hard; each talks to one node). Memory per waiter is\n", set.FDLimit)
	w("the growth of the %d nodes' VmRSS summed, and of Redis' `used_memory`, from %d to all of them waiting, per waiter.\n",
		set.Nodes, set.BaseWaiters)
	w("Idle Redis load: every command over %.0f s (INFO commandstats) with nobody moving. Handoffs are the gaps from an\n", set.IdleWindowS)
	w("upstream completion's end to the arrival of the request that took its permit (mockllm timeline) over %.0f s:\n", set.HandoffWindowS)
	w("with %d always waiting (a closed loop of %d streams), and while the deep queue drains once the permits are\n", set.BaseWaiters, set.BaseWaiters+set.Permits)
	w("released. The deep queue passes if its p99 is at most max(%.2fx, +%.0f ms) the shallow one's.\n\n", set.HandoffTolerance, set.HandoffSlackMS)
	w("| waiting | Caddy RSS MiB (%d nodes) | Redis used_memory MiB | Redis cmds/s idle | scripts/s idle | handoff p50 ms | p90 ms | p99 ms | max ms | handoffs |\n|---|---|---|---|---|---|---|---|---|---|\n", set.Nodes)
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
			set.BaseWaiters, s.HandoffBase.CPULine(), s.Queued, s.HandoffDeep.CPULine())
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
		w(" Note: %s", OneLine(s.Note, 300))
	}
	w("\n")
	if q := s.Queues; q != nil {
		w("\n%d queues on one node and one Redis: one handler whose `name` is `{http.request.header.X-Queue}` (a handler opens\n", q.Queues)
		w("at most 100), each queue with its %d permits held and %d waiters. Memory is the growth of `used_memory` over the\n", set.QueuePermits, set.QueueWaiters)
		w("node with no queue open; `used_memory` also moves with Redis' own buffers, which shrink after the deep run (the\n")
		w("first row can come out negative), so the figure per queue added is the difference between the two rows.\n\n")
		w("| queues | waiting | Redis cmds/s idle | Redis used_memory KiB | Caddy RSS MiB |\n|---|---|---|---|---|\n")
		w("| 1 | %d | %.1f | %+.1f | %.1f |\n", set.QueueWaiters, q.OneCmdsPerS, kib(q.OneMem), mib(q.RSSOne))
		if q.Queues > 1 {
			w("| %d | %d | %.1f | %+.1f | %.1f |\n", q.Queues, q.Waiting, q.ManyCmdsPerS, kib(q.ManyMem), mib(q.RSSMany))
			w("\nPer queue added: %.2f KiB of Redis memory, %.1f Redis cmds/s idle. Commands over the idle window with %d queues: %s.\n",
				q.perQueueKiB(), (q.ManyCmdsPerS-q.OneCmdsPerS)/float64(q.Queues-1), q.Queues, topCommands(q.ManyCommands, 6))
		}
		if q.Note != "" {
			w("\nNote: %s\n", OneLine(q.Note, 300))
		}
	}
}

// CPULine describes the CPU over a handoff window.
func (h *Handoffs) CPULine() string {
	line := fmt.Sprintf("machine %.0f%% busy, Caddy %.2f cores, Redis %.2f", 100*h.MachineBusy, h.CaddyCores, h.RedisCores)
	if h.ClientCores > 0 {
		line += fmt.Sprintf(", clients %.2f", h.ClientCores)
	}
	if h.RedisRTTP99 > 0 {
		line += fmt.Sprintf("; Redis round trip p50 %.3f ms, p99 %.3f ms", h.RedisRTTP50, h.RedisRTTP99)
	}
	return line
}

// ClientShare is the load of one client process: its node and its count.
type ClientShare struct {
	// Node is the index of the node the process talks to; Waiters how
	// many streams it holds there.
	Node    int `json:"node"`
	Waiters int `json:"waiters"`
}

// DefaultScaleSettings returns the scenario's loads for waiters streams (0: the
// default 50,000) and a limit of fdLimit open files per process.
func DefaultScaleSettings(waiters, fdLimit int) ScaleSettings {
	if waiters <= 0 {
		waiters = 50_000
	}
	// 700/s: at 1000/s on 2 cores some connects to the loaded nodes
	// timed out (loadgen's 5 s dial timeout) near 50,000 connections.
	s := ScaleSettings{
		Waiters: waiters, BaseWaiters: 100, Nodes: 3, RampRPS: 700, PromptBytes: 1 << 10,
		FDLimit: fdLimit, FDReserve: 2000, IdleWindowS: 10, HandoffWindowS: 5,
		Queues: 100, QueuePermits: 4, QueueWaiters: 5,
		HandoffTolerance: 1.25, HandoffSlackMS: 1,
	}
	s.ClientProcs = clientProcs(waiters, s.Nodes, fdLimit-s.FDReserve)
	return s
}

// clientProcs is how many client processes hold total connections, each
// under perProc: at least one per node, a multiple of the nodes (each
// process talks to one node, so every node gets as many).
func clientProcs(total, nodes, perProc int) int {
	if perProc <= 0 || nodes <= 0 {
		return max(nodes, 1)
	}
	n := (total + perProc - 1) / perProc
	n = max(n, nodes)
	if r := n % nodes; r != 0 {
		n += nodes - r
	}
	return n
}
