package bench

// The capacity scenario's figures: each run's summary, the targets, the
// report's section and the plots over time.

import (
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/fair-queue/caddy-fair-queue/bench/internal/systems"
	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
)

// TargetCapacityKV is the capacity scenario's check of the mock itself.
const TargetCapacityKV = "capacity: a replica's KV tokens never above its cache"

// summarizeCapacity fills run's counts, goodput, TTFT and SLO share from
// the requests' results. A request that got no token counts, in the TTFT
// percentiles, the time it waited until it was cut or answered.
func summarizeCapacity(run *CapacityRun, results []capResult, set CapacitySettings) {
	var ttft []time.Duration
	var end time.Duration
	tokens, slo := 0, 0
	for _, r := range results {
		run.Sent++
		end = max(end, r.End)
		switch {
		case r.Done && r.Err == "" && !r.Rejected:
			run.Finished++
			tokens += r.Tokens
		case r.Rejected:
			run.Rejected++
		case r.Cut:
			run.Cut++
		default:
			run.Failed++
			if run.Errors == nil {
				run.Errors = map[string]int{}
			}
			run.Errors[genericError(r.Err)]++
		}
		first := r.FirstToken - r.Start
		if r.Tokens == 0 {
			first = r.End - r.Start
		}
		ttft = append(ttft, first)
		if r.Done && !r.Rejected && r.Err == "" && msOf(first) <= set.SLOTTFTMS {
			tpot := 0.0
			if r.Tokens > 1 {
				tpot = msOf(r.End-r.FirstToken) / float64(r.Tokens-1)
			}
			if tpot <= set.SLOTPOTMS {
				slo++
			}
		}
	}
	if len(results) == 0 {
		return
	}
	run.ElapsedS = round(end.Seconds(), 2)
	if end > 0 {
		run.GoodputTPS = round(float64(tokens)/end.Seconds(), 1)
	}
	slices.Sort(ttft)
	q := quantiles(ttft, 100)
	run.TTFTP50MS, run.TTFTP99MS = round(q[50], 1), round(q[99], 1)
	run.SLOShare = round(float64(slo)/float64(len(results)), 3)
}

// capacityChecks checks every run's replicas held no more KV tokens than
// their caches.
func capacityChecks(c *Capacity) []Check {
	if c == nil {
		return nil
	}
	var checks []Check
	for _, cs := range c.Cases {
		t := c.topology(cs.Topology)
		if t == nil {
			continue
		}
		over, most := false, []string{}
		for _, r := range cs.Runs {
			for i, kv := range r.MaxKVUsed {
				if i < len(t.Replicas) && kv > t.Replicas[i].KVTokens {
					over = true
				}
			}
		}
		for _, r := range t.Replicas {
			most = append(most, itoa(r.KVTokens))
		}
		checks = append(checks, Check{Target: TargetCapacityKV, System: cs.Topology + "/" + cs.Workload,
			Value: "caches " + strings.Join(most, ", "), Result: verdict(!over)})
	}
	return checks
}

func (c *Capacity) topology(name string) *CapacityTopology {
	for i := range c.Settings.Topologies {
		if c.Settings.Topologies[i].Name == name {
			return &c.Settings.Topologies[i]
		}
	}
	return nil
}

func (c *Capacity) workload(name string) *CapacityWorkload {
	for i := range c.Settings.Workloads {
		if c.Settings.Workloads[i].Name == name {
			return &c.Settings.Workloads[i]
		}
	}
	return nil
}

// capacityPlotFile is the plot of one case's samples.
func capacityPlotFile(cs *CapacityCase) string {
	return "capacity-" + cs.Topology + "-" + cs.Workload + ".png"
}

// capacityMarkdown writes the capacity section of BENCHMARKS.md; plots
// maps a case's plot file to its link, those drawn.
func capacityMarkdown(b *strings.Builder, c *Capacity, plots map[string]string) {
	if c == nil {
		return
	}
	w := func(format string, args ...any) { fmt.Fprintf(b, format, args...) }
	set := c.Settings
	w("\n## Capacity: fixed permits in front of a GPU-shaped backend\n\n")
	w("mockllm's GPU model (`-kv-tokens`, see `cmd/mockllm`): every running request holds its prompt and its answer so far\n")
	w("in a KV cache of fixed size; a step serves the whole batch and lasts step_base + step_per_seq x batch +\n")
	w("prefill_per_token x the prompt tokens it computes (in chunks of max_batched_tokens); when the cache would\n")
	w("overflow, the newest running request is preempted and recomputed later; beyond max_num_seqs requests wait\n")
	w("in the server. Replicas:\n\n| topology | replica | KV tokens | max_num_seqs | max_batched_tokens | step_base ms | step_per_seq ms | prefill us / token |\n|---|---|---|---|---|---|---|---|\n")
	for _, t := range set.Topologies {
		for i, r := range t.Replicas {
			w("| %s | %d | %d | %d | %d | %.1f | %.2f | %.1f |\n", t.Label, i+1, r.KVTokens, r.MaxNumSeqs, r.MaxBatchedTokens,
				r.StepBaseMS, r.StepPerSeqMS, r.PrefillPerTokUS)
		}
	}
	w("\nWorkloads (prompts uniform in their range, answers log-normal, in tokens; Poisson arrivals for %.0f s at\n", set.ArrivalsS)
	w("`load` x the topology's ideal capacity; every system gets the same sequence):\n\n")
	w("| workload | long share | chat prompt | long prompt | answer median (sigma, max) | load |\n|---|---|---|---|---|---|\n")
	for _, wl := range set.Workloads {
		w("| %s | %.0f%% | %d-%d | %d-%d | %d (%.1f, %d) | %.2f |\n", wl.Label, 100*wl.LongShare, wl.ChatPromptMin, wl.ChatPromptMax,
			wl.LongPromptMin, wl.LongPromptMax, wl.AnswerMedian, wl.AnswerSigma, wl.AnswerMax, wl.Load)
	}
	w("\nSystems: the backend alone (the client sends to the replicas in turn; each queues what it cannot run),\n")
	w("HAProxy `maxconn` per server, fair_queue (local store) with a fixed `permits` per replica (a pool: `upstream`\n")
	w("lines, `dynamic fair_queue`). Goodput: completion tokens of the finished requests per second from the first\n")
	w("arrival to the last answer (at most %.0f s after the last arrival; the rest are cut). TTFT: time to the first\n", set.DrainMaxS)
	w("token at the client (a request that got none counts its wait until cut). SLO: finished, TTFT <= %.0f ms and\n", set.SLOTTFTMS)
	w("<= %.0f ms per later token on average; its share is of the requests sent. The ideal: each replica runs as many\n", set.SLOTPOTMS)
	w("sequences as its cache holds of the mix's average one, never preempts and never idles; its TTFT is a prompt's\n")
	w("own prefill in a full batch, no wait (a bound no real run reaches under overload).\n")
	for _, cs := range c.Cases {
		t, wl := c.topology(cs.Topology), c.workload(cs.Workload)
		if t == nil || wl == nil {
			continue
		}
		id := cs.Ideal
		w("\n### %s, %s\n\n", t.Label, wl.Label)
		w("%d requests at %.2f/s, %d prompt and %d completion tokens. Ideal: %.0f tokens/s (capacity %.0f, batch %v),\n",
			cs.Requests, cs.RateRPS, cs.PromptTokens, cs.CompletionTokens, id.GoodputTPS, id.CapacityTPS, id.Batch)
		w("TTFT p50 %.0f ms, p99 %.0f ms.", id.TTFTP50MS, id.TTFTP99MS)
		if cs.BestPermits > 0 {
			w(" Best fixed permits: **%d** per replica; worst: %d.", cs.BestPermits, cs.WorstPermits)
			for _, p := range []int{cs.BestPermits, cs.WorstPermits} {
				if r := cs.fairQueue(p); r != nil && id.GoodputTPS > 0 && id.TTFTP99MS > 0 {
					w(" Permits %d: %.0f%% of the ideal goodput lost, TTFT p99 %.1fx the ideal's.", p,
						100*(1-r.GoodputTPS/id.GoodputTPS), r.TTFTP99MS/id.TTFTP99MS)
				}
				if cs.BestPermits == cs.WorstPermits {
					break
				}
			}
		}
		w("\n\n| system | goodput tok/s | vs ideal | TTFT p50 ms | TTFT p99 ms | TTFT p99 vs ideal | SLO met | preemptions | finished / sent | cut | rejected | failed | max KV tokens | max running | max waiting in server | wall s |\n")
		w("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n")
		for _, r := range cs.Runs {
			if r.Error != "" {
				w("| %s | not measured: `%s` |||||||||||||||\n", r.Row.Label, oneLine(r.Error, 160))
				continue
			}
			label := r.Row.Label
			if r.Row.Kind == systems.KindFairQueue && r.Row.Permits == cs.BestPermits {
				label = "**" + label + "** (best)"
			}
			ttftVs := ""
			if id.TTFTP99MS > 0 {
				ttftVs = fmt.Sprintf("%.1fx", r.TTFTP99MS/id.TTFTP99MS)
			}
			w("| %s | %.0f | %.2fx | %.0f | %.0f | %s | %.0f%% | %d | %d / %d | %d | %d | %d | %s | %s | %s | %.1f |\n",
				label, r.GoodputTPS, r.VsIdeal, r.TTFTP50MS, r.TTFTP99MS, ttftVs, 100*r.SLOShare, r.Preemptions, r.Finished, r.Sent,
				r.Cut, r.Rejected, r.Failed, ints(r.MaxKVUsed), ints(r.MaxRunning), ints(r.MaxWaiting), r.ElapsedS)
		}
		if link, ok := plots[capacityPlotFile(cs)]; ok {
			w("\n![KV tokens, running and waiting over time, %s, %s](%s)\n", t.Label, wl.Label, link)
		}
	}
}

// fairQueue returns the fair_queue run with permits, or nil.
func (cs *CapacityCase) fairQueue(permits int) *CapacityRun {
	for _, r := range cs.Runs {
		if r.Row.Kind == systems.KindFairQueue && r.Row.Permits == permits && r.Error == "" {
			return r
		}
	}
	return nil
}

func ints(vs []int) string {
	s := make([]string, len(vs))
	for i, v := range vs {
		s[i] = itoa(v)
	}
	return strings.Join(s, " + ")
}

// writeCapacityPlots draws, per case, the replicas' KV tokens, running
// and waiting requests over time (summed over the replicas), one line per
// system: the backend alone, HAProxy, and the best and the worst fixed
// permits. It returns the files written.
func writeCapacityPlots(c *Capacity, dir string) ([]string, error) {
	if c == nil {
		return nil, nil
	}
	var written []string
	for _, cs := range c.Cases {
		var runs []*CapacityRun
		for _, r := range cs.Runs {
			if r.Error != "" || len(r.Samples) == 0 {
				continue
			}
			if r.Row.Kind != systems.KindFairQueue || r.Row.Permits == cs.BestPermits || r.Row.Permits == cs.WorstPermits {
				runs = append(runs, r)
			}
		}
		if len(runs) == 0 {
			continue
		}
		panels := []struct {
			ylabel string
			value  func(CapacitySample) float64
		}{
			{"KV tokens held", func(s CapacitySample) float64 { return float64(s.KVUsed) }},
			{"requests running", func(s CapacitySample) float64 { return float64(s.Running) }},
			{"waiting in the server", func(s CapacitySample) float64 { return float64(s.Waiting) }},
		}
		kv := 0.0
		if t := c.topology(cs.Topology); t != nil {
			for _, r := range t.Replicas {
				kv += float64(r.KVTokens)
			}
		}
		var plots []*plot.Plot
		for pi, panel := range panels {
			p := plot.New()
			if pi == 0 {
				p.Title.Text = fmt.Sprintf("Capacity: %s, %s", cs.Topology, cs.Workload)
			}
			p.X.Label.Text = "time since the first arrival (s)"
			p.Y.Label.Text = panel.ylabel
			p.Y.Min = 0
			p.Add(plotter.NewGrid())
			p.Legend.Top = true
			for i, r := range runs {
				xys := make(plotter.XYs, len(r.Samples))
				for j, s := range r.Samples {
					xys[j] = plotter.XY{X: s.AtS, Y: panel.value(s)}
				}
				if err := addLine(p, i, r.Row.Label, xys); err != nil {
					return written, err
				}
			}
			if pi == 0 && kv > 0 && len(runs[0].Samples) > 1 {
				end := runs[0].Samples[len(runs[0].Samples)-1].AtS
				for _, r := range runs {
					end = max(end, r.Samples[len(r.Samples)-1].AtS)
				}
				l, err := plotter.NewLine(plotter.XYs{{X: 0, Y: kv}, {X: end, Y: kv}})
				if err != nil {
					return written, err
				}
				l.Dashes = plotutil.Dashes(2)
				p.Add(l)
				p.Legend.Add("KV cache size", l)
			}
			if pi > 0 {
				p.Legend = plot.NewLegend() // one legend, on the first panel
			}
			plots = append(plots, p)
		}
		file := capacityPlotFile(cs)
		if err := savePanels(plots, 18*vg.Centimeter, 24*vg.Centimeter, filepath.Join(dir, file)); err != nil {
			return written, err
		}
		written = append(written, file)
	}
	return written, nil
}
