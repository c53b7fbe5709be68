package report

import (
	"fmt"
	"path/filepath"
	"slices"
	"strings"

	"github.com/fair-queue/caddy-fair-queue/bench/internal/systems"
)

// Files says where a run's outputs go.
type Files struct {
	// OutDir receives results.json, the plots and logs/.
	OutDir string
	// Markdown is the report (BENCHMARKS.md); empty: none.
	Markdown string
}

// Markdown renders BENCHMARKS.md from the results of a run, plots
// being the files WritePlots wrote.
func Markdown(res *Results, opts Files, plots []string) string {
	var b strings.Builder
	w := func(format string, args ...any) { fmt.Fprintf(&b, format, args...) }
	set := res.Settings
	m := res.Machine
	cmd := "make bench"
	if res.Mode == "quick" {
		cmd = "make bench-quick"
	}

	w("# Benchmarks\n\n")
	w("fair_queue side by side with HAProxy (`maxconn` + `timeout queue`) and plain Caddy `reverse_proxy`,\n")
	w("all in front of the same mock LLM, on one machine. This file is written by `%s`\n", cmd)
	w("(`bench/`); the raw figures are in `%s/results.json`, the plots beside it.\n\n",
		filepath.ToSlash(opts.OutDir))
	w("Last run: **%s** mode, %s, %.0f s.\n\n", res.Mode, res.Started.Format("2006-01-02 15:04 MST"), res.Elapsed)

	w("## Machine\n\n| nproc | CPU | memory | kernel | Go | Redis | HAProxy | Caddy |\n|---|---|---|---|---|---|---|---|\n")
	w("| %d | %s | %d MiB | %s | %s | %s | %s | %s |\n\n", m.CPUs, m.CPU, m.MemoryMB, m.Kernel, m.Go,
		orNone(version(m.Redis, "v=")), orNone(version(m.HAProxy, "version ")), orNone(version(m.Caddy, "")))
	w("The load generator runs on the same %d CPUs as the servers it measures: absolute numbers are\n", m.CPUs)
	w("lower bounds for a real deployment, the comparisons between systems are what matters. Load average\n")
	w("(1 min) when the run started: **%.2f** (above ~0.5, other work shared the CPUs and the figures are\n", m.LoadStart)
	w("noisier than usual); when it ended: %.2f, the bench's own processes included. A quick run is short:\n", m.LoadEnd)
	w("compare several runs, not single figures.\n\n")

	w("## Targets\n\n| target | system | measured | result |\n|---|---|---|---|\n")
	for _, c := range res.Checks {
		w("| %s | %s | %s | %s |\n", c.Target, c.System, c.Value, c.Result)
	}
	w("\n")
	for _, s := range res.Systems {
		if s.Error != "" {
			w("- **%s** was not measured: `%s`\n", s.Spec.Label, OneLine(s.Error, 300))
		}
	}

	w("\n## Saturated: %d clients, %d permits, %.0f ms upstream\n\n", set.Clients, set.Permits, set.ServiceMS)
	w("Closed loop for %.0f s, unstreamed answers. Handoff: upstream arrival of a request minus the end of the\n", set.SaturatedS)
	w("previous completion it replaced (mockllm `-timeline`); utilization: busy permit-time / (permits x wall time).\n")
	w("The upstream alone, %d clients straight to mockllm, serves **%.1f req/s** (%.1f streamed): the ceiling of\n", set.Permits, set.UpstreamRPS, set.UpstreamStreamRPS)
	w("every limiter here.\n\n")
	loadTable(&b, res, pickSaturated, pickUpstreamQueues)
	if set.StreamSaturated {
		w("\nThe same with streamed answers (%d tokens x %.0f ms):\n\n", set.StreamTokens, set.StreamTokenMS)
		loadTable(&b, res, func(s *System) *LoadRun { return s.SaturatedStream }, nil)
	}

	w("\n(a) every command Redis executed, those run inside the scripts included (INFO commandstats counts both).\n")
	w("(b) user+system CPU time (`/proc/<pid>/stat`) consumed over the load's window by the proxy processes\n")
	w("(every Caddy node, or haproxy) and by redis-server (Redis systems only), divided by the requests answered\n")
	w("in it (the kernel counts CPU time in clock ticks, 10 ms at the usual 100 Hz: a few %% of a quick run's\n")
	w("windows). The ratio divides by the proxy CPU per request of plain reverse_proxy on as many nodes when that\n")
	w("ran: under the same load at low load; when saturated, reverse_proxy under the same %d clients in front of an\n", set.Clients)
	w("upstream that queues what exceeds %d itself (mockllm's slots, as a model server's own queue does; below):\n", set.Permits)
	w("the same client connections, upstream concurrency and about the same throughput, the queue in the upstream\n")
	w("instead of the proxy (unlimited, reverse_proxy's %d-client load above serves several times as many requests\n", set.Clients)
	w("per second, and each costs less CPU at that rate). \"with Redis\" adds Redis' CPU to the queue's side.\n")
	w("The CPU the load generator, mockllm and other work on the machine take is not counted, but they share the\n")
	w("CPUs: on a loaded machine a process waits longer and wakes up more often.\n")
	var atPermits []string
	for _, s := range res.Systems {
		if r := s.AtPermits; r != nil {
			atPermits = append(atPermits, fmt.Sprintf("%s %.1f req/s, p50 %.2f ms, proxy CPU %.4f ms / req",
				s.Spec.Label, r.Throughput, r.P50, r.ProxyCPUPerRequest))
		}
	}
	if len(atPermits) > 0 {
		w("\nreverse_proxy with %d clients, %.0f s (no client waits anywhere; the CPU reference of an earlier bench,\n", set.Permits, set.SaturatedS)
		w("reported in the targets): %s.\n", strings.Join(atPermits, "; "))
	}
	var queues []string
	for _, s := range res.Systems {
		if r := s.UpstreamQueues; r != nil {
			queues = append(queues, upstreamQueuing(s.Spec.Label, r))
		}
	}
	if len(queues) > 0 {
		w("\nreverse_proxy with %d clients, the upstream queueing beyond %d, %.0f s: %s.\n", set.Clients, set.Permits, set.SaturatedS, strings.Join(queues, "; "))
	}
	if set.ShortServiceMS > 0 {
		w("\n## Saturated: %d clients, %d permits, %g ms upstream\n\n", set.Clients, set.Permits, set.ShortServiceMS)
		w("The same load with short answers (embeddings, rerankers, small models, cached answers): the handoff is a\n")
		w("larger share of a permit's turn. The upstream alone, %d clients, serves **%.1f req/s**.\n\n", set.Permits, set.UpstreamShortRPS)
		loadTable(&b, res, pickSaturatedShort, pickUpstreamQueuesShort)
		var short []string
		for _, s := range res.Systems {
			if r := s.UpstreamQueuesShort; r != nil {
				short = append(short, upstreamQueuing(s.Spec.Label, r))
			}
		}
		if len(short) > 0 {
			w("\nreverse_proxy with %d clients, the upstream queueing beyond %d: %s.\n", set.Clients, set.Permits, strings.Join(short, "; "))
		}
	}
	handoffBreakdown(&b, res)
	w("\n## Low load: fast-path overhead\n\n")
	w("%d client, back-to-back requests, upstream answers at once (1 token, no delay), %.0f s. Each system is\n", set.LowLoadClients, set.LowLoadS)
	w("compared with plain reverse_proxy on as many nodes when that ran, else on one (the client's requests go\n")
	w("round-robin to the nodes): what the queue adds, without what the topology adds. The targets name the\n")
	w("baseline each used.")
	if set.RedisRTTP50MS > 0 {
		w("\nOne Redis round trip (a no-op script call from go-redis) takes p50 **%.3f ms**, p99 %.3f ms, when\n", set.RedisRTTP50MS, set.RedisRTTP99MS)
		w("Redis has been idle for 0.5 ms, as between the requests of this load (%.3f ms back to back: most of\n", set.RedisRTTBusyP50MS)
		w("the round trip is waking up an idle process): the least a queue shared through Redis adds. The\n")
		w("acquire is one such call; the release runs after the answer and adds none to its request, but\n")
		w("takes CPU from the next one on a machine this small.")
	}
	w("\n\n")
	w("| system | requests | p50 ms | p99 ms | p50 vs reverse_proxy | p99 vs reverse_proxy | Redis scripts / req | Redis cmds / req (a) | proxy CPU ms / req (b) | Redis CPU ms / req (b) | CPU / req vs reverse_proxy (b) |\n|---|---|---|---|---|---|---|---|---|---|---|\n")
	for _, s := range res.Systems {
		if s.LowLoad == nil {
			continue
		}
		d50, d99 := "", ""
		if base := res.baseline(s); base != nil && s.Spec.Kind != systems.KindPlain {
			d50 = fmt.Sprintf("%+.3f ms", s.LowLoad.P50-base.LowLoad.P50)
			d99 = fmt.Sprintf("%+.3f ms", s.LowLoad.P99-base.LowLoad.P99)
		}
		proxyCPU, redisCPU, cpuRatio := cpuFigs(res, s, pickLowLoad, pickLowLoad)
		w("| %s | %d | %.3f | %.3f | %s | %s | %s | %s | %s | %s | %s |\n", s.Spec.Label, s.LowLoad.Requests, s.LowLoad.P50, s.LowLoad.P99,
			d50, d99, redisFig(s, s.LowLoad.ScriptsPerRequest), redisFig(s, s.LowLoad.CommandsPerRequest),
			proxyCPU, redisCPU, cpuRatio)
	}

	w("\n## Open loop: wait vs arrival rate\n\n")
	w("Fixed arrival rate for %.0f s per point, streamed answers of %d x %.0f ms. Load = rate / %.1f req/s, the\n",
		set.OpenLoopS, set.StreamTokens, set.StreamTokenMS, set.UpstreamStreamRPS)
	w("measured throughput of the upstream alone with %d clients.\n", set.Permits)
	w("Wait = time to first byte (mockllm sends its headers at once).\n\n")
	w("| system | rate req/s | load | wait p50 ms | wait p99 ms | ok | rejected | failed |\n|---|---|---|---|---|---|---|---|\n")
	for _, s := range res.Systems {
		for _, p := range s.OpenLoop {
			w("| %s | %.0f | %.2f | %.2f | %.2f | %d | %d | %d |\n", s.Spec.Label, p.Rate, p.Load, p.WaitP50, p.WaitP99, p.OK, p.Rejected, p.Failed)
		}
	}

	w("\n## Many waiters\n\n")
	w("All %d permits held by streams that last minutes, then N requests queued behind them on one Caddy node.\n", set.Permits)
	w("RSS: `VmRSS` of the Caddy process before and after queueing them. Idle Redis load: every command Redis\n")
	w("executed over %.0f s (INFO commandstats, the bench's own INFO excluded) with the waiters queued, compared\n", set.IdleWindowS)
	w("with the same node holding only a few waiters. The waiters arrive at %.0f req/s (fewer for large prompts:\n", set.WaiterRampRPS)
	w("at most %.0f MiB/s of them). While every permit is held no waiter may reach the upstream: \"upstream max\"\n", set.WaiterRampMiBps)
	w("above %d, or waiters served, mean requests got in without a permit.", set.Permits)
	if len(set.Bursts) > 0 {
		w(" The burst runs (Redis store) send them much faster and check only that.")
	}
	w("\n\n")
	w("| system | waiters | prompt | queued | RSS before MiB | RSS after MiB | KiB per waiter | Redis cmds/s (few waiters) | Redis cmds/s (all waiting) | scripts/s | upstream max | served / failed / rejected | note |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|\n")
	for _, x := range res.Waiters {
		base, idle, scripts := "", "", ""
		if x.BaseWaiters > 0 {
			base = fmt.Sprintf("%.1f (%d)", x.BaseCmdsPerS, x.BaseWaiters)
			idle = fmt.Sprintf("%.1f", x.IdleCmdsPerS)
			scripts = fmt.Sprintf("%.1f", x.IdleScripts)
		}
		note := x.Note
		if len(x.Reasons) > 0 {
			note = strings.TrimSpace(note + " rejects: " + fmt.Sprint(x.Reasons))
		}
		w("| %s | %d at %.0f/s | %d KiB | %d | %.1f | %.1f | %.1f | %s | %s | %s | %d | %d / %d / %d | %s |\n", x.System, x.Waiters, x.RampRPS, x.PromptBytes/1024, x.Queued,
			float64(x.RSSBefore)/(1<<20), float64(x.RSSAfter)/(1<<20), x.RSSPerWaiter, base, idle, scripts,
			x.UpstreamMax, x.Served, x.Failed, x.Rejected, OneLine(note, 160))
	}

	configsMarkdown(&b, res.Configs, set)
	fairPlot := ""
	if slices.Contains(plots, PlotFairness) {
		fairPlot = plotLink(opts, PlotFairness)
	}
	fairnessMarkdown(&b, res.Fairness, fairPlot)
	var llmPlots []string
	for _, p := range []string{PlotLLMWait, PlotLLMUtil} {
		if slices.Contains(plots, p) {
			llmPlots = append(llmPlots, plotLink(opts, p))
		}
	}
	llmMarkdown(&b, res.LLM, llmPlots)
	scaleMarkdown(&b, res.Scale)
	capacityPlots := map[string]string{}
	for _, p := range plots {
		if strings.HasPrefix(p, "capacity-") {
			capacityPlots[p] = plotLink(opts, p)
		}
	}
	capacityMarkdown(&b, res.Capacity, capacityPlots)

	if len(plots) > 0 {
		w("\n## Plots\n\nWritten to `%s/` (not committed: run the bench to see them):\n\n", filepath.ToSlash(opts.OutDir))
		for _, p := range plots {
			w("- `%s`\n", p)
		}
	}

	w("\n## Reproduce\n\n```sh\nmake bench-quick   # about 4 minutes: short loads, %d waiters, one capacity workload; reports, never fails on noise\n", DefaultSettings(true).Waiters)
	w("make bench         # longer loads, more rates, a streaming saturated load, %d waiters, the capacity sweep\n", DefaultSettings(false).Waiters)
	w("make bench-capacity # the capacity scenario alone, short (about a minute), into bench-results/capacity/\n```\n\n")
	w("Both build `bin/caddy` and `bin/mockllm`, install `redis-server` and `haproxy` from the Debian packages if\n")
	w("missing, start every server on free loopback ports, stop them all at the end, and rewrite this file.\n")
	w("Logs and configs of the last run are in `%s/logs/`.\n", filepath.ToSlash(opts.OutDir))
	return b.String()
}

// handoffBreakdown writes the handoff of each limiter under each
// saturated load, and what each adds over the one before it: fair_queue
// local over HAProxy (Caddy's proxying and the in-process handoff), the
// Redis store over the local one (the release script and the grant's
// Pub/Sub message, or the local handoff's transfer), 3 nodes over 1
// (grants to another node).
func handoffBreakdown(b *strings.Builder, res *Results) {
	loads := saturatedLoads(res.Settings)
	w := func(format string, args ...any) { fmt.Fprintf(b, format, args...) }
	w("\n## Handoff breakdown\n\n")
	w("Handoff: the upstream arrival of a request minus the end of the completion whose permit it took\n")
	w("(mockllm `-timeline`), p50 / p99 in ms; in brackets, the p50 added over the row above: fair_queue local\n")
	w("over HAProxy is Caddy's proxying and the in-process handoff, Redis over local the release script and the\n")
	w("grant's Pub/Sub message (or a local handoff's transfer), 3 nodes over 1 the grants to another node.\n")
	if res.Settings.RedisRTTP50MS > 0 {
		w("One Redis round trip: p50 %.3f ms back to back, %.3f ms after 0.5 ms idle.\n", res.Settings.RedisRTTBusyP50MS, res.Settings.RedisRTTP50MS)
	}
	w("\n| system |")
	for _, l := range loads {
		w(" %g ms upstream |", l.serviceMS)
	}
	w("\n|---|")
	for range loads {
		w("---|")
	}
	w("\n")
	prev := make([]*LoadRun, len(loads))
	for _, s := range res.Systems {
		if !s.Spec.Limited() || s.Error != "" {
			continue
		}
		w("| %s |", s.Spec.Label)
		for i, l := range loads {
			run := l.pick(s)
			if run == nil || run.HandoffCount == 0 {
				w(" |")
				continue
			}
			w(" %.3f / %.3f", run.HandoffP50, run.HandoffP99)
			if p := prev[i]; p != nil {
				w(" (%+.3f)", run.HandoffP50-p.HandoffP50)
			}
			w(" |")
			prev[i] = run
		}
		w("\n")
	}
	for _, s := range res.Systems {
		if s.Spec.Kind != systems.KindPlain || s.Spec.Nodes != 1 {
			continue
		}
		var cells []string
		for _, l := range loads {
			if run := l.upstreamQueues(s); run != nil && run.HandoffCount > 0 {
				cells = append(cells, fmt.Sprintf("%.3f / %.3f ms at %g ms", run.HandoffP50, run.HandoffP99, l.serviceMS))
			}
		}
		if len(cells) > 0 {
			w("\n%s in front of an upstream that queues itself hands on inside the upstream: %s.\n", s.Spec.Label, strings.Join(cells, ", "))
		}
	}
}

// loadTable writes one row per system for the load pick selects.
// refPick selects the load of plain reverse_proxy that the CPU per
// request is compared with; nil: none.
func loadTable(b *strings.Builder, res *Results, pick, refPick func(*System) *LoadRun) {
	ha := res.System("haproxy")
	fmt.Fprintf(b, "| system | req/s | vs HAProxy | p50 ms | p99 ms | upstream max / permits | utilization | handoff p50 / p99 ms | Redis scripts / req | Redis cmds / req (a) | proxy CPU ms / req (b) | Redis CPU ms / req (b) | CPU / req vs reverse_proxy (b) | rejected | failed |\n")
	fmt.Fprintf(b, "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n")
	for _, s := range res.Systems {
		run := pick(s)
		if run == nil {
			continue
		}
		ratio := ""
		if s.Spec.Limited() && ha != nil && pick(ha) != nil && pick(ha).Throughput > 0 {
			ratio = fmt.Sprintf("%.3fx", run.Throughput/pick(ha).Throughput)
		}
		limit, util, handoff := "unlimited", "", ""
		if s.Spec.Limited() {
			limit = fmt.Sprintf("%d", res.Settings.Permits)
			util = fmt.Sprintf("%.3f", run.Utilization)
			handoff = fmt.Sprintf("%.3f / %.3f", run.HandoffP50, run.HandoffP99)
		}
		proxyCPU, redisCPU, cpuRatio := cpuFigs(res, s, pick, refPick)
		fmt.Fprintf(b, "| %s | %.1f | %s | %.2f | %.2f | %d / %s | %s | %s | %s | %s | %s | %s | %s | %d | %d |\n",
			s.Spec.Label, run.Throughput, ratio, run.P50, run.P99, run.UpstreamMax, limit, util, handoff,
			redisFig(s, run.ScriptsPerRequest), redisFig(s, run.CommandsPerRequest), proxyCPU, redisCPU, cpuRatio,
			run.Rejected, run.Failed)
	}
}

// cpuFigs formats the proxy and Redis CPU per request of s under the
// load pick selects, and their ratio to the proxy CPU per request of
// plain reverse_proxy under the load refPick selects (as many nodes when
// that ran; none when refPick is nil): the proxy alone, then with Redis.
// Empty when not measured.
func cpuFigs(res *Results, s *System, pick, refPick func(*System) *LoadRun) (proxy, redis, ratio string) {
	run := pick(s)
	if run == nil || run.ProxyCPUPerRequest <= 0 {
		return "", "", ""
	}
	proxy = fmt.Sprintf("%.4f", run.ProxyCPUPerRequest)
	if s.Spec.Redis {
		redis = fmt.Sprintf("%.4f", run.RedisCPUPerRequest)
	}
	if s.Spec.Kind == systems.KindPlain {
		return proxy, redis, ""
	}
	if base, refRun := cpuReference(res, s, refPick); base != nil && refRun.ProxyCPUPerRequest > 0 {
		ref := refRun.ProxyCPUPerRequest
		ratio = fmt.Sprintf("%.2fx", run.ProxyCPUPerRequest/ref)
		if s.Spec.Redis {
			ratio += fmt.Sprintf(" (%.2fx with Redis)", run.TotalCPUPerRequest()/ref)
		}
		if base.Spec.Nodes != s.Spec.Nodes {
			ratio += fmt.Sprintf(" vs %d node", base.Spec.Nodes)
		}
	}
	return proxy, redis, ratio
}

func redisFig(s *System, v float64) string {
	if !s.Spec.Redis {
		return ""
	}
	return fmt.Sprintf("%.2f", v)
}

func orNone(s string) string {
	if s == "" {
		return "not installed"
	}
	return strings.ReplaceAll(s, "|", "/")
}

// OneLine puts s on one line, its spaces collapsed and its pipes made
// slashes (for a table cell), cut to n bytes and "...".
func OneLine(s string, n int) string {
	s = strings.Join(strings.Fields(s), " ")
	s = strings.ReplaceAll(s, "|", "/")
	if len(s) > n {
		s = s[:n] + "..."
	}
	return s
}

// version picks the version out of a server's version line: the word
// after marker ("v=7.0.15"), or the first word.
func version(line, marker string) string {
	if i := strings.Index(line, marker); marker != "" && i >= 0 {
		line = line[i+len(marker):]
	}
	if f := strings.Fields(line); len(f) > 0 {
		return f[0]
	}
	return ""
}

// plotLink is the path of plot file as a link from the report: relative
// to the report's directory when both paths are.
func plotLink(opts Files, file string) string {
	p := filepath.Join(opts.OutDir, file)
	if opts.Markdown != "" {
		if rel, err := filepath.Rel(filepath.Dir(opts.Markdown), p); err == nil {
			p = rel
		}
	}
	return filepath.ToSlash(p)
}

// upstreamQueuing is one line of reverse_proxy's run in front of an
// upstream that queues itself.
func upstreamQueuing(label string, r *LoadRun) string {
	return fmt.Sprintf("%s %.1f req/s, p50 %.2f ms, upstream max %d, handoff p50 / p99 %.3f / %.3f ms (inside the upstream), proxy CPU %.4f ms / req",
		label, r.Throughput, r.P50, r.UpstreamMax, r.HandoffP50, r.HandoffP99, r.ProxyCPUPerRequest)
}

// plotNote names a plot of the run under the table it draws, as text
// and not an image: the plots are written to the run's output folder,
// which git ignores, so that an image link would be broken on GitHub
// and in every clone.
func plotNote(alt, path string) string {
	return fmt.Sprintf("Plot (%s): `%s`, written by the run, not committed.", alt, path)
}
