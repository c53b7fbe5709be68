package bench

// The capacity scenario: what a fixed permit count costs in front of a
// backend shaped like a GPU (mockllm -kv-tokens: one batch whose steps
// slow as it grows, a KV cache whose overflow preempts). A mixed workload
// of chats and long-context prompts arrives above what the backend
// serves, the same drawn sequence for every system: the backend alone
// (it queues what it cannot run itself), HAProxy maxconn, and fair_queue
// with a sweep of fixed permits. On one replica, then on a pool of two
// replicas of different KV sizes. Everything the scenario runs is in
// CapacitySettings: the later capacity rows (permits in tokens, learned
// capacity) are one more CapacityRow each.

import (
	"slices"

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

// args are the mockllm flags of r.
func (r GPUReplica) args() []string {
	return []string{
		"-kv-tokens", itoa(r.KVTokens), "-max-num-seqs", itoa(r.MaxNumSeqs),
		"-max-batched-tokens", itoa(r.MaxBatchedTokens),
		"-step-base", ms2d(r.StepBaseMS).String(), "-step-per-seq", ms2d(r.StepPerSeqMS).String(),
		"-prefill-per-token", ms2d(r.PrefillPerTokUS / 1000).String(),
	}
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
}

// KindAlone is the backend with no limiter: the client sends every
// request to a replica in turn, and the replica queues what it cannot run.
const KindAlone = "alone"

// capacitySettings returns the scenario of a quick or a full run.
func capacitySettings(quick bool) CapacitySettings {
	// A replica about a tenth as fast as a real GPU, so that a run
	// streams few enough tokens for a small machine: a step of 15 ms
	// plus 0.25 ms per sequence, 5 us per prompt token.
	replica := func(kv int) GPUReplica {
		return GPUReplica{KVTokens: kv, MaxNumSeqs: 64, MaxBatchedTokens: 8192,
			StepBaseMS: 15, StepPerSeqMS: 0.25, PrefillPerTokUS: 5}
	}
	mixed := CapacityWorkload{
		Name: "mixed", Label: "mixed: chats and 5% long-context prompts",
		LongShare: 0.05, ChatPromptMin: 100, ChatPromptMax: 1000, LongPromptMin: 8000, LongPromptMax: 30000,
		AnswerMedian: 60, AnswerSigma: 0.7, AnswerMax: 600, Load: 1.3,
	}
	chat := mixed
	chat.Name, chat.Label, chat.LongShare = "chat", "chat only", 0
	s := CapacitySettings{
		Topologies: []CapacityTopology{
			{Name: "one", Label: "one replica (48k KV tokens)", Replicas: []GPUReplica{replica(48_000)}},
			// The smaller replica still holds the longest prompt (30k).
			{Name: "pool", Label: "pool of two replicas (48k and 32k KV tokens)", Replicas: []GPUReplica{replica(48_000), replica(32_000)}},
		},
		Workloads: []CapacityWorkload{mixed, chat},
		Rows:      append([]CapacityRow{alone(), haproxyRow(16)}, fqRows(4, 8, 16, 32, 64)...),
		PoolRows:  append([]CapacityRow{alone(), haproxyRow(16)}, fqRows(8, 16, 32)...),
		ArrivalsS: 20, DrainMaxS: 40, MaxWaitS: 300,
		SLOTTFTMS: 2000, SLOTPOTMS: 60, SampleMS: 200, Seed: 30_000,
	}
	if quick {
		s.Workloads = s.Workloads[:1]
		s.Rows = append([]CapacityRow{alone(), haproxyRow(16)}, fqRows(8, 32)...)
		s.PoolRows = append([]CapacityRow{alone()}, fqRows(16)...)
		s.ArrivalsS, s.DrainMaxS = 4, 8
	}
	return s
}

// only keeps the topologies and workloads named in names, from every one
// of a full run; a kind none of whose names is named stays as it was.
func (s CapacitySettings) only(names []string) CapacitySettings {
	all := capacitySettings(false)
	var tops []CapacityTopology
	for _, t := range all.Topologies {
		if slices.Contains(names, t.Name) {
			tops = append(tops, t)
		}
	}
	var works []CapacityWorkload
	for _, w := range all.Workloads {
		if slices.Contains(names, w.Name) {
			works = append(works, w)
		}
	}
	if len(tops) > 0 {
		s.Topologies = tops
	}
	if len(works) > 0 {
		s.Workloads = works
	}
	return s
}

func alone() CapacityRow {
	return CapacityRow{Name: "alone", Label: "backend alone", Kind: KindAlone}
}

func haproxyRow(maxconn int) CapacityRow {
	return CapacityRow{Name: "haproxy-" + itoa(maxconn), Label: "HAProxy maxconn " + itoa(maxconn), Kind: systems.KindHAProxy, Permits: maxconn}
}

func fqRows(permits ...int) []CapacityRow {
	var out []CapacityRow
	for _, p := range permits {
		out = append(out, CapacityRow{Name: "fq-" + itoa(p), Label: "fair_queue permits " + itoa(p), Kind: systems.KindFairQueue, Permits: p})
	}
	return out
}

// rows returns the rows run in front of t.
func (s CapacitySettings) rows(t CapacityTopology) []CapacityRow {
	if len(t.Replicas) > 1 && len(s.PoolRows) > 0 {
		return s.PoolRows
	}
	return s.Rows
}

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
