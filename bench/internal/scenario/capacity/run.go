package capacity

// The capacity scenario's runs: the replicas, the systems in front of
// them, the drawn sequence sent to each.

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"time"

	"github.com/fair-queue/caddy-fair-queue/bench/internal/procs"
	"github.com/fair-queue/caddy-fair-queue/bench/internal/report"
	"github.com/fair-queue/caddy-fair-queue/bench/internal/scenario"
	"github.com/fair-queue/caddy-fair-queue/bench/internal/systems"
	"github.com/fair-queue/caddy-fair-queue/internal/mockllm"
)

// Run runs the capacity scenario: every workload on every
// topology, each row in turn. names picks topologies and workloads from
// those of a full run (see onlyCases); empty: the mode's.
func Run(ctx context.Context, b *scenario.Runner, names []string) {
	set := onlyCases(report.DefaultCapacitySettings(b.Quick), names)
	c := &report.Capacity{Settings: set}
	b.Res.Capacity = c
	b.Logf("== capacity: a GPU-shaped backend, %.0f s of arrivals per run; SLO: TTFT <= %.0f ms, TPOT <= %.0f ms",
		set.ArrivalsS, set.SLOTTFTMS, set.SLOTPOTMS)
	for _, t := range set.Topologies {
		if ctx.Err() != nil {
			return
		}
		addrs, stop, err := startReplicas(ctx, b, t)
		if err != nil {
			b.Logf("   %s: not measured: %v", t.Label, report.OneLine(err.Error(), 300))
			continue
		}
		for wi, w := range set.Workloads {
			seq, rate, ideal := capacityPlan(set, t, wi)
			cs := &report.CapacityCase{Topology: t.Name, Workload: w.Name, Requests: len(seq), RateRPS: rate, Ideal: ideal}
			for _, q := range seq {
				cs.CompletionTokens += q.Answer
				cs.PromptTokens += q.Prompt
			}
			c.Cases = append(c.Cases, cs)
			cr := &caseRunner{b: b, set: set, top: t, work: w, addrs: addrs, seq: seq}
			b.Logf("== capacity, %s, %s: %d requests at %.2f/s (load %.2f); ideal %.0f tokens/s (batch %v), TTFT p99 %.0f ms",
				t.Label, w.Label, len(seq), rate, w.Load, ideal.GoodputTPS, ideal.Batch, ideal.TTFTP99MS)
			for _, row := range capacityRows(set, t) {
				if ctx.Err() != nil {
					break
				}
				run := cr.run(ctx, row)
				if run.Error == "" && ideal.GoodputTPS > 0 {
					run.VsIdeal = report.Round(run.GoodputTPS/ideal.GoodputTPS, 3)
				}
				cs.Runs = append(cs.Runs, run)
				if run.Error != "" {
					b.Logf("   %-22s not measured: %s", row.Label, report.OneLine(run.Error, 300))
					continue
				}
				if len(run.Errors) > 0 {
					b.Logf("   %-22s errors: %v", row.Label, run.Errors)
				}
				b.Logf("   %-22s goodput %6.0f tok/s (%.2fx ideal)  TTFT p50 %6.0f p99 %6.0f ms  SLO %.2f  preempted %4d  finished %d/%d cut %d rejected %d failed %d  max KV %v  %.1f s",
					row.Label, run.GoodputTPS, run.VsIdeal, run.TTFTP50MS, run.TTFTP99MS, run.SLOShare, run.Preemptions,
					run.Finished, run.Sent, run.Cut, run.Rejected, run.Failed, run.MaxKVUsed, run.ElapsedS)
			}
			cs.BestPermits, cs.WorstPermits = sweepEnds(cs.Runs)
		}
		stop()
	}
}

// sweepEnds returns the permits of the fair_queue runs with the most and
// the least goodput.
func sweepEnds(runs []*report.CapacityRun) (best, worst int) {
	var fq []*report.CapacityRun
	for _, r := range runs {
		if r.Row.Kind == systems.KindFairQueue && !r.Row.KVTokens && !r.Row.Adaptive && r.Error == "" {
			fq = append(fq, r)
		}
	}
	if len(fq) == 0 {
		return 0, 0
	}
	by := func(a, b *report.CapacityRun) int {
		if a.GoodputTPS != b.GoodputTPS {
			if a.GoodputTPS < b.GoodputTPS {
				return -1
			}
			return 1
		}
		return b.Row.Permits - a.Row.Permits // a tie: fewer permits is better
	}
	return slices.MaxFunc(fq, by).Row.Permits, slices.MinFunc(fq, by).Row.Permits
}

// startReplicas starts t's mockllm replicas; stop stops them.
func startReplicas(ctx context.Context, b *scenario.Runner, t report.CapacityTopology) (addrs []string, stop func(), err error) {
	ports, err := procs.FreePorts(len(t.Replicas))
	if err != nil {
		return nil, nil, err
	}
	var started []*procs.Proc
	stop = func() {
		for _, p := range started {
			b.Env.Procs.Stop(p)
		}
	}
	for i, r := range t.Replicas {
		addr := "127.0.0.1:" + itoa(ports[i])
		args := append([]string{"-listen", addr, "-seed", itoa(i)}, replicaArgs(r)...)
		p, err := b.Env.Procs.Start(fmt.Sprintf("capacity-%s-%d", t.Name, i+1), b.MockLLM, args...)
		if err != nil {
			stop()
			return nil, nil, err
		}
		started = append(started, p)
		if err := p.WaitListen(ctx, addr, 15*time.Second); err != nil {
			stop()
			return nil, nil, err
		}
		addrs = append(addrs, addr)
	}
	return addrs, stop, nil
}

// caseRunner runs the rows of one case: a workload's sequence on a
// topology's replicas.
type caseRunner struct {
	b     *scenario.Runner
	set   report.CapacitySettings
	top   report.CapacityTopology
	work  report.CapacityWorkload
	addrs []string // the replicas, host:port
	seq   []capRequest
}

// run sends the sequence through row in front of the replicas.
func (cr *caseRunner) run(ctx context.Context, row report.CapacityRow) *report.CapacityRun {
	b, set, addrs := cr.b, cr.set, cr.addrs
	run := &report.CapacityRun{Row: row}
	fail := func(err error) *report.CapacityRun {
		run.Error = err.Error()
		return run
	}
	if err := replicasIdle(ctx, b, addrs, 60*time.Second); err != nil {
		return fail(err)
	}
	var targets []string
	if row.Kind == report.KindAlone {
		for _, a := range addrs {
			targets = append(targets, "http://"+a)
		}
	} else {
		env := *b.Env
		env.MockAddr, env.Permits, env.MaxWait = addrs[0], row.Permits, report.Secs(set.MaxWaitS)
		if len(addrs) > 1 {
			env.Pool = addrs
		}
		if row.Adaptive {
			env.AdaptiveTTFT = report.MS(set.SLOTTFTMS)
		}
		if row.KVTokens {
			for _, r := range cr.top.Replicas {
				env.KVTokens = append(env.KVTokens, r.KVTokens)
			}
		}
		env.DefaultMaxTokens, env.Status = row.DefaultMaxTokens, row.NoMaxTokens
		spec := systems.Spec{Name: "capacity-" + cr.top.Name + "-" + cr.work.Name + "-" + row.Name, Label: row.Label, Kind: row.Kind, Nodes: 1}
		r, err := env.Start(ctx, spec)
		if err != nil {
			return fail(err)
		}
		defer env.Stop(r)
		targets = r.Targets
	}
	for _, a := range addrs {
		if err := b.Post(ctx, "http://"+a+"/stats/reset"); err != nil {
			return fail(err)
		}
	}
	rctx, cancel := context.WithTimeout(ctx, report.Secs(set.ArrivalsS+set.DrainMaxS))
	defer cancel()
	sampled := make(chan []report.CapacitySample, 1)
	sctx, stopSampling := context.WithCancel(ctx)
	start := time.Now()
	go func() { sampled <- sampleReplicas(sctx, b, addrs, start, report.MS(set.SampleMS)) }()
	results := sendCapacity(rctx, targets, cr.seq, start, row.NoMaxTokens)
	stopSampling()
	run.Samples = <-sampled
	if ctx.Err() != nil {
		return fail(ctx.Err())
	}
	if row.NoMaxTokens && row.Kind == systems.KindFairQueue {
		budget, answers, err := learnedBudget(ctx, b, targets[0])
		if err != nil {
			return fail(err)
		}
		run.CompletionBudget, run.BudgetAnswers = budget, answers
	}
	summarizeCapacity(run, results, set)
	for _, a := range addrs {
		st, err := replicaStats(ctx, b, a)
		if err != nil {
			return fail(err)
		}
		run.Preemptions += st.Preemptions
		run.MaxKVUsed = append(run.MaxKVUsed, st.MaxKVUsed)
		run.MaxRunning = append(run.MaxRunning, st.MaxRunning)
		run.MaxWaiting = append(run.MaxWaiting, st.MaxWaiting)
	}
	return run
}

// replicasIdle waits until no replica runs or holds a request (the
// previous run's cut requests leave), at most limit.
func replicasIdle(ctx context.Context, b *scenario.Runner, addrs []string, limit time.Duration) error {
	deadline := time.Now().Add(limit)
	for {
		busy := 0
		for _, a := range addrs {
			st, err := replicaStats(ctx, b, a)
			if err != nil {
				return err
			}
			busy += st.Running + st.Waiting
		}
		if busy == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("replicas still hold %d requests after %s", busy, limit)
		}
		if err := scenario.SleepCtx(ctx, 100*time.Millisecond); err != nil {
			return err
		}
	}
}

// learnedBudget reads the completion budget the queue of the fair_queue
// node at target learned (0 while none is) and the answers it learned it
// from, from its status page (systems.StatusPath).
func learnedBudget(ctx context.Context, b *scenario.Runner, target string) (budget, answers int64, err error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, target+systems.StatusPath+"?format=json", nil)
	if err != nil {
		return 0, 0, err
	}
	resp, err := b.HC.Do(req)
	if err != nil {
		return 0, 0, err
	}
	defer resp.Body.Close()
	var st struct {
		Queues []struct {
			KV *struct {
				CompletionBudget  int64 `json:"completion_budget"`
				CompletionSamples int64 `json:"completion_samples"`
			} `json:"kv"`
		} `json:"queues"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
		return 0, 0, fmt.Errorf("%s%s: %w", target, systems.StatusPath, err)
	}
	for _, q := range st.Queues {
		if q.KV != nil {
			return q.KV.CompletionBudget, q.KV.CompletionSamples, nil
		}
	}
	return 0, 0, fmt.Errorf("%s%s: no queue counts tokens", target, systems.StatusPath)
}

// replicaStats reads the GPU model's figures of the replica at addr.
func replicaStats(ctx context.Context, b *scenario.Runner, addr string) (*mockllm.GPUStats, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/stats", nil)
	if err != nil {
		return nil, err
	}
	resp, err := b.HC.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var st mockllm.Stats
	if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
		return nil, fmt.Errorf("%s/stats: %w", addr, err)
	}
	if st.GPU == nil {
		return nil, fmt.Errorf("%s runs no GPU model", addr)
	}
	return st.GPU, nil
}

// sampleReplicas reads the replicas every period until ctx ends and
// returns their sums over time.
func sampleReplicas(ctx context.Context, b *scenario.Runner, addrs []string, start time.Time, period time.Duration) []report.CapacitySample {
	var out []report.CapacitySample
	tick := time.NewTicker(period)
	defer tick.Stop()
	for {
		s := report.CapacitySample{AtS: report.Round(time.Since(start).Seconds(), 2)}
		for _, a := range addrs {
			st, err := replicaStats(ctx, b, a)
			if err != nil {
				return out
			}
			s.KVUsed += st.KVUsed
			s.Running += st.Running
			s.Waiting += st.Waiting
		}
		out = append(out, s)
		select {
		case <-ctx.Done():
			return out
		case <-tick.C:
		}
	}
}

// summarizeCapacity fills run's counts, goodput, TTFT and SLO share from
// the requests' results. A request that got no token counts, in the TTFT
// percentiles, the time it waited until it was cut or answered.
func summarizeCapacity(run *report.CapacityRun, results []capResult, set report.CapacitySettings) {
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
			run.Errors[scenario.GenericError(r.Err)]++
		}
		first := r.FirstToken - r.Start
		if r.Tokens == 0 {
			first = r.End - r.Start
		}
		ttft = append(ttft, first)
		if r.Done && !r.Rejected && r.Err == "" && report.MSOf(first) <= set.SLOTTFTMS {
			tpot := 0.0
			if r.Tokens > 1 {
				tpot = report.MSOf(r.End-r.FirstToken) / float64(r.Tokens-1)
			}
			if tpot <= set.SLOTPOTMS {
				slo++
			}
		}
	}
	if len(results) == 0 {
		return
	}
	run.ElapsedS = report.Round(end.Seconds(), 2)
	if end > 0 {
		run.GoodputTPS = report.Round(float64(tokens)/end.Seconds(), 1)
	}
	slices.Sort(ttft)
	q := scenario.Quantiles(ttft, 100)
	run.TTFTP50MS, run.TTFTP99MS = report.Round(q[50], 1), report.Round(q[99], 1)
	run.SLOShare = report.Round(float64(slo)/float64(len(results)), 3)
}

// replicaArgs are the mockllm flags of r.
func replicaArgs(r report.GPUReplica) []string {
	return []string{
		"-kv-tokens", itoa(r.KVTokens), "-max-num-seqs", itoa(r.MaxNumSeqs),
		"-max-batched-tokens", itoa(r.MaxBatchedTokens),
		"-step-base", report.MS(r.StepBaseMS).String(), "-step-per-seq", report.MS(r.StepPerSeqMS).String(),
		"-prefill-per-token", report.MS(r.PrefillPerTokUS / 1000).String(),
	}
}
