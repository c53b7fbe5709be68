package report

// The capacity scenario's figures: each run's summary, the targets and
// the report's section (the plots over time: capacity_plot.go).

import (
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/fair-queue/caddy-fair-queue/bench/internal/systems"
)

// CapacitySettings shape the capacity scenario: every knob in one place.
type CapacitySettings struct {
	// Topologies are the backends, each a set of GPU replicas.
	Topologies []CapacityTopology `json:"topologies"`
	// Workloads are the request mixes, each run on every topology.
	Workloads []CapacityWorkload `json:"workloads"`
	// Rows are the systems in front of each topology, in run order.
	Rows []CapacityRow `json:"rows"`
	// PoolRows, when set, replace Rows on topologies of several
	// replicas (a quick run runs fewer there).
	PoolRows []CapacityRow `json:"pool_rows,omitempty"`
	// ArrivalsS is how long arrivals last; DrainMaxS bounds the wait
	// for the answers after the last (those left are cut, unfinished).
	ArrivalsS float64 `json:"arrivals_s"`
	DrainMaxS float64 `json:"drain_max_s"`
	// MaxWaitS is fair_queue's max_wait and HAProxy's timeout queue.
	MaxWaitS float64 `json:"max_wait_s"`
	// SLOTTFTMS and SLOTPOTMS are the service level: a request meets it
	// when it finished, its first token came within SLOTTFTMS and its
	// tokens after the first came SLOTPOTMS apart or less on average.
	SLOTTFTMS float64 `json:"slo_ttft_ms"`
	SLOTPOTMS float64 `json:"slo_tpot_ms"`
	// SampleMS is the period of the replicas' samples (the plots).
	SampleMS float64 `json:"sample_ms"`
	// Seed is the base of each workload's seed.
	Seed uint64 `json:"seed"`
}

// CapacityTopology is one backend: its replicas.
type CapacityTopology struct {
	Name     string       `json:"name"`
	Label    string       `json:"label"`
	Replicas []GPUReplica `json:"replicas"`
}

// GPUReplica is one mockllm GPU model (its flags).
type GPUReplica struct {
	KVTokens         int     `json:"kv_tokens"`
	MaxNumSeqs       int     `json:"max_num_seqs"`
	MaxBatchedTokens int     `json:"max_batched_tokens"`
	StepBaseMS       float64 `json:"step_base_ms"`
	StepPerSeqMS     float64 `json:"step_per_seq_ms"`
	PrefillPerTokUS  float64 `json:"prefill_per_token_us"`
}

// CapacityWorkload is a request mix and its arrival rate.
type CapacityWorkload struct {
	Name  string `json:"name"`
	Label string `json:"label"`
	// LongShare is the share of long-context requests; the others are
	// chats. Prompts are uniform in their range, in tokens.
	LongShare     float64 `json:"long_share"`
	ChatPromptMin int     `json:"chat_prompt_min"`
	ChatPromptMax int     `json:"chat_prompt_max"`
	LongPromptMin int     `json:"long_prompt_min"`
	LongPromptMax int     `json:"long_prompt_max"`
	// AnswerMedian, AnswerSigma and AnswerMax draw the completions (in
	// tokens) from a log-normal, capped.
	AnswerMedian int     `json:"answer_median"`
	AnswerSigma  float64 `json:"answer_sigma"`
	AnswerMax    int     `json:"answer_max"`
	// Load is the arrival rate as a multiple of the topology's ideal
	// capacity for this mix (idealCapacity): above 1, more arrives than
	// the backend can serve.
	Load float64 `json:"load"`
}

// CapacityRow is one system in front of a topology.
type CapacityRow struct {
	// Name is short and unique ("fq-16"); Label how tables show it.
	Name  string `json:"name"`
	Label string `json:"label"`
	// Kind is KindAlone, KindHAProxy or KindFairQueue.
	Kind string `json:"kind"`
	// Permits is the fixed count per replica: HAProxy's maxconn of each
	// server, fair_queue's permits (its upstreams' with a pool).
	Permits int `json:"permits,omitempty"`
	// KVTokens sets fair_queue's kv_tokens to each replica's KV cache
	// size (its upstreams' with a pool), beside Permits.
	KVTokens bool `json:"kv_tokens,omitempty"`
	// Adaptive makes fair_queue learn its capacity under Permits (the
	// ceiling), with the SLO's TTFT as its target.
	Adaptive bool `json:"adaptive,omitempty"`
	// NoMaxTokens makes the clients send no completion budget: each
	// answer's length goes in mockllm's X-Mock-Tokens header instead of
	// max_tokens, and the body asks for the usage (stream_options
	// include_usage), so that fair_queue weighs the budget it learned from
	// the answers' usage, or DefaultMaxTokens where set.
	NoMaxTokens bool `json:"no_max_tokens,omitempty"`
	// DefaultMaxTokens, when set, is fair_queue's default_max_tokens: the
	// budget of a request that sets none, fixed instead of learned.
	DefaultMaxTokens int `json:"default_max_tokens,omitempty"`
}

// KindAlone is the backend with no limiter: the client sends every
// request to a replica in turn, and the replica queues what it cannot run.
const KindAlone = "alone"

// Capacity is what the capacity scenario measured.
type Capacity struct {
	Settings CapacitySettings `json:"settings"`
	// Cases holds one entry per topology and workload.
	Cases []*CapacityCase `json:"cases"`
}

// CapacityCase is one workload on one topology: the ideal and each row.
type CapacityCase struct {
	Topology string `json:"topology"`
	Workload string `json:"workload"`
	// Requests is the drawn sequence's size, RateRPS its arrival rate;
	// CompletionTokens and PromptTokens its tokens summed.
	Requests         int     `json:"requests"`
	RateRPS          float64 `json:"rate_rps"`
	CompletionTokens int     `json:"completion_tokens"`
	PromptTokens     int     `json:"prompt_tokens"`
	// Ideal is the backend's bound: never preempting, never idle.
	Ideal Ideal `json:"ideal"`
	// Runs holds one run per row, in the order of the rows.
	Runs []*CapacityRun `json:"runs"`
	// BestPermits and WorstPermits are the fair_queue rows of the sweep
	// with the most and the least goodput (0: no sweep).
	BestPermits  int `json:"best_permits,omitempty"`
	WorstPermits int `json:"worst_permits,omitempty"`
}

// Ideal is a backend's bound on a workload (idealCapacity).
type Ideal struct {
	// Batch is the sequences a replica runs at once when its cache is
	// full of the mix's average sequence (at most max_num_seqs), per
	// replica.
	Batch []float64 `json:"batch"`
	// CapacityTPS is the completion tokens per second the replicas make
	// together at those batches; GoodputTPS the least of it and the
	// offered rate (all arrivals served as they come).
	CapacityTPS float64 `json:"capacity_tps"`
	GoodputTPS  float64 `json:"goodput_tps"`
	// TTFTP50MS and TTFTP99MS are the time to first token without any
	// wait: each prompt's own prefill in a full batch.
	TTFTP50MS float64 `json:"ttft_p50_ms"`
	TTFTP99MS float64 `json:"ttft_p99_ms"`
}

// CapacityRun is one row on one case.
type CapacityRun struct {
	Row   CapacityRow `json:"row"`
	Error string      `json:"error,omitempty"`
	// Sent, Finished, Rejected (a 429/503 from the limiter), Failed and
	// Cut (unfinished at the drain bound) count requests.
	Sent     int `json:"sent"`
	Finished int `json:"finished"`
	Rejected int `json:"rejected"`
	Failed   int `json:"failed"`
	Cut      int `json:"cut"`
	// Errors counts the failures by error (numbers and addresses as N).
	Errors map[string]int `json:"errors,omitempty"`
	// ElapsedS is the first arrival to the last answer.
	ElapsedS float64 `json:"elapsed_s"`
	// GoodputTPS is the completion tokens of the finished requests per
	// second of ElapsedS; VsIdeal its ratio to the ideal's.
	GoodputTPS float64 `json:"goodput_tps"`
	VsIdeal    float64 `json:"vs_ideal"`
	// TTFT* are the time to first token of the requests that got one,
	// at the client, ms.
	TTFTP50MS float64 `json:"ttft_p50_ms"`
	TTFTP99MS float64 `json:"ttft_p99_ms"`
	// SLOShare is the share of the requests sent that met the SLO.
	SLOShare float64 `json:"slo_share"`
	// Preemptions, MaxKVUsed (per replica, in order) and MaxRunning,
	// MaxWaiting come from the replicas' /stats.
	Preemptions int64 `json:"preemptions"`
	MaxKVUsed   []int `json:"max_kv_used"`
	MaxRunning  []int `json:"max_running"`
	MaxWaiting  []int `json:"max_waiting"`
	// CompletionBudget is the completion budget fair_queue learned for
	// the requests that set none, read from its status page at the run's
	// end (0: none learned, or the row fixes it); BudgetAnswers is the
	// answers it learned it from. Rows with NoMaxTokens only.
	CompletionBudget int64 `json:"completion_budget,omitempty"`
	BudgetAnswers    int64 `json:"budget_answers,omitempty"`
	// Samples are the replicas summed over time.
	Samples []CapacitySample `json:"samples,omitempty"`
}

// CapacitySample is the replicas' state at one time, summed.
type CapacitySample struct {
	AtS     float64 `json:"t"`
	KVUsed  int     `json:"kv"`
	Running int     `json:"running"`
	Waiting int     `json:"waiting"`
}

// TargetCapacityKV is the capacity scenario's check of the mock itself.
const TargetCapacityKV = "capacity: a replica's KV tokens never above its cache"

// TargetCapacityTokens is admission by tokens against the best fixed
// permits of the sweep, on the mixed workload.
const TargetCapacityTokens = "capacity: kv_tokens >= 1.2x the best fixed permits' goodput, TTFT p99 no worse, <= 1% preempted"

// TargetCapacityAdaptive is the learned capacity against the best fixed
// permits of the sweep: started at the ceiling, within 15% of its goodput.
const TargetCapacityAdaptive = "capacity: adaptive from the ceiling >= 0.85x the best fixed permits' goodput"

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
			most = append(most, strconv.Itoa(r.KVTokens))
		}
		checks = append(checks, Check{Target: TargetCapacityKV, System: cs.Topology + "/" + cs.Workload,
			Value: "caches " + strings.Join(most, ", "), Result: verdict(!over)})
		if kv, best := cs.kvTokens(), cs.fairQueue(cs.BestPermits); kv != nil && best != nil && best.GoodputTPS > 0 {
			ratio := kv.GoodputTPS / best.GoodputTPS
			ok := ratio >= 1.2 && kv.TTFTP99MS <= best.TTFTP99MS && kv.PreemptedShare() <= 0.01
			checks = append(checks, Check{Target: TargetCapacityTokens, System: cs.Topology + "/" + cs.Workload,
				Value: fmt.Sprintf("%.2fx goodput vs permits %d, TTFT p99 %.0f vs %.0f ms, %.1f%% preempted", ratio,
					cs.BestPermits, kv.TTFTP99MS, best.TTFTP99MS, 100*kv.PreemptedShare()), Result: verdict(ok)})
		}
		if ad, best := cs.adaptive(), cs.fairQueue(cs.BestPermits); ad != nil && best != nil && best.GoodputTPS > 0 {
			ratio := ad.GoodputTPS / best.GoodputTPS
			checks = append(checks, Check{Target: TargetCapacityAdaptive, System: cs.Topology + "/" + cs.Workload,
				Value: fmt.Sprintf("%.2fx goodput vs permits %d, TTFT p99 %.0f vs %.0f ms, %.1f%% preempted", ratio,
					cs.BestPermits, ad.TTFTP99MS, best.TTFTP99MS, 100*ad.PreemptedShare()), Result: verdict(ratio >= 0.85)})
		}
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
	w("lines, `dynamic fair_queue`), and fair_queue admitting by tokens: `kv_tokens` at each replica's KV cache size\n")
	w("(each request weighs its prompt estimate plus its `max_tokens`; the workload's `max_tokens` is each answer's\n")
	w("length, so the budget is exact here), `permits` at max_num_seqs; and fair_queue learning its capacity (`adaptive`,\n")
	w("the ceiling `permits` at max_num_seqs, `target_ttft` the SLO's, interval 250 ms, the replicas' `/metrics` read). Goodput: completion tokens of the finished requests per second from the first\n")
	w("arrival to the last answer (at most %.0f s after the last arrival; the rest are cut). TTFT: time to the first\n", set.DrainMaxS)
	w("token at the client (a request that got none counts its wait until cut). SLO: finished, TTFT <= %.0f ms and\n", set.SLOTTFTMS)
	w("<= %.0f ms per later token on average; its share is of the requests sent. The ideal: each replica runs as many\n", set.SLOTPOTMS)
	w("sequences as its cache holds of the mix's average one, never preempts and never idles; its TTFT is a prompt's\n")
	w("own prefill in a full batch, no wait (a bound no real run reaches under overload).\n")
	if slices.ContainsFunc(slices.Concat(set.Rows, set.PoolRows), func(r CapacityRow) bool { return r.NoMaxTokens }) {
		w("\nRows labelled *no max_tokens*: the same requests, but the clients send no `max_tokens` (the mock reads each answer's\n")
		w("length from its `X-Mock-Tokens` header) and ask for the usage (`stream_options.include_usage`); fair_queue weighs\n")
		w("each request's completion with the budget it learned from the answers' usage (the 95th percentile of the last 256\n")
		w("answers, 1024 before 20 are seen), or with a fixed `default_max_tokens` where the row sets one.\n")
	}
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
				w("| %s | not measured: `%s` |||||||||||||||\n", r.Row.Label, OneLine(r.Error, 160))
				continue
			}
			label := r.Row.Label
			if r.Row.Kind == systems.KindFairQueue && !r.Row.KVTokens && !r.Row.Adaptive && r.Row.Permits == cs.BestPermits {
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
		budgetNotes(w, cs)
		if link, ok := plots[capacityPlotFile(cs)]; ok {
			w("\n%s\n", plotNote(fmt.Sprintf("KV tokens, running and waiting over time, %s, %s", t.Label, wl.Label), link))
		}
	}
}

// budgetNotes writes, under a case's table, the completion budget each
// run whose clients sent no max_tokens was weighed with.
func budgetNotes(w func(string, ...any), cs *CapacityCase) {
	var notes []string
	for _, r := range cs.Runs {
		switch {
		case !r.Row.NoMaxTokens || r.Error != "":
		case r.Row.DefaultMaxTokens > 0:
			notes = append(notes, fmt.Sprintf("%s: fixed at %d tokens", r.Row.Label, r.Row.DefaultMaxTokens))
		case r.CompletionBudget > 0:
			notes = append(notes, fmt.Sprintf("%s: learned **%d** tokens from %d answers", r.Row.Label, r.CompletionBudget, r.BudgetAnswers))
		default:
			notes = append(notes, fmt.Sprintf("%s: none learned (%d answers seen), %d tokens", r.Row.Label, r.BudgetAnswers, DefaultMaxTokens))
		}
	}
	if len(notes) > 0 {
		w("\nCompletion budget of the requests without max_tokens: %s.\n", strings.Join(notes, "; "))
	}
}

// DefaultMaxTokens is fair_queue's completion budget of a request that
// sets none before its queue learned one (caddyfairqueue.DefaultMaxTokens).
const DefaultMaxTokens = 1024

// fairQueue returns the fair_queue run with permits, or nil.
func (cs *CapacityCase) fairQueue(permits int) *CapacityRun {
	for _, r := range cs.Runs {
		if r.Row.Kind == systems.KindFairQueue && !r.Row.KVTokens && !r.Row.Adaptive && r.Row.Permits == permits && r.Error == "" {
			return r
		}
	}
	return nil
}

// kvTokens returns the fair_queue run with kv_tokens and the exact
// budgets, or nil.
func (cs *CapacityCase) kvTokens() *CapacityRun {
	for _, r := range cs.Runs {
		if r.Row.KVTokens && !r.Row.NoMaxTokens && r.Error == "" {
			return r
		}
	}
	return nil
}

// adaptive returns the fair_queue run with adaptive, or nil.
func (cs *CapacityCase) adaptive() *CapacityRun {
	for _, r := range cs.Runs {
		if r.Row.Adaptive && r.Error == "" {
			return r
		}
	}
	return nil
}

// PreemptedShare is a run's preemptions per request sent.
func (r *CapacityRun) PreemptedShare() float64 {
	if r.Sent == 0 {
		return 0
	}
	return float64(r.Preemptions) / float64(r.Sent)
}

func ints(vs []int) string {
	s := make([]string, len(vs))
	for i, v := range vs {
		s[i] = strconv.Itoa(v)
	}
	return strings.Join(s, " + ")
}
