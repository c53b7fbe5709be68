package report

// The capacity scenario's default settings: its backends, workloads and
// rows.

import (
	"strconv"

	"github.com/fair-queue/caddy-fair-queue/bench/internal/systems"
)

// DefaultCapacitySettings returns the scenario of a quick or a full run.
func DefaultCapacitySettings(quick bool) CapacitySettings {
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
		Rows:      append([]CapacityRow{alone(), haproxyRow(16)}, append(fqRows(4, 8, 16, 32, 64), kvRow(), adaptiveRow(), kvLearnedRow(), kvFixedRow(DefaultMaxTokens))...),
		PoolRows:  append([]CapacityRow{alone(), haproxyRow(16)}, append(fqRows(8, 16, 32), kvRow(), adaptiveRow())...),
		ArrivalsS: 20, DrainMaxS: 40, MaxWaitS: 300,
		SLOTTFTMS: 2000, SLOTPOTMS: 60, SampleMS: 200, Seed: 30_000,
	}
	if quick {
		s.Workloads = s.Workloads[:1]
		s.Rows = append([]CapacityRow{alone(), haproxyRow(16)}, append(fqRows(8, 32), kvRow(), adaptiveRow())...)
		s.PoolRows = append([]CapacityRow{alone()}, append(fqRows(16), kvRow())...)
		s.ArrivalsS, s.DrainMaxS = 4, 8
	}
	return s
}

func alone() CapacityRow {
	return CapacityRow{Name: "alone", Label: "backend alone", Kind: KindAlone}
}

func haproxyRow(maxconn int) CapacityRow {
	return CapacityRow{Name: "haproxy-" + strconv.Itoa(maxconn), Label: "HAProxy maxconn " + strconv.Itoa(maxconn), Kind: systems.KindHAProxy, Permits: maxconn}
}

func fqRows(permits ...int) []CapacityRow {
	var out []CapacityRow
	for _, p := range permits {
		out = append(out, CapacityRow{Name: "fq-" + strconv.Itoa(p), Label: "fair_queue permits " + strconv.Itoa(p), Kind: systems.KindFairQueue, Permits: p})
	}
	return out
}

// kvRow is fair_queue admitting by tokens: kv_tokens at each replica's
// KV cache size, and permits at its max_num_seqs (more would only queue
// in the replica).
func kvRow() CapacityRow {
	return CapacityRow{Name: "fq-kv", Label: "fair_queue kv_tokens (KV size)", Kind: systems.KindFairQueue, Permits: 64, KVTokens: true}
}

// adaptiveRow is fair_queue learning its capacity (adaptive) under a
// ceiling of max_num_seqs, its target the SLO's time to first token.
func adaptiveRow() CapacityRow {
	return CapacityRow{Name: "fq-adaptive", Label: "fair_queue adaptive (ceiling 64, backend gauges)", Kind: systems.KindFairQueue, Permits: 64, Adaptive: true}
}

// kvLearnedRow is kvRow with clients that send no max_tokens: fair_queue
// weighs the completion budget it learned from the answers' usage.
func kvLearnedRow() CapacityRow {
	r := kvRow()
	r.Name, r.Label, r.NoMaxTokens = "fq-kv-learned", "fair_queue kv_tokens, no max_tokens, budget learned", true
	return r
}

// kvFixedRow is kvLearnedRow with the budget fixed at tokens
// (default_max_tokens): the behaviour before the budget was learned.
func kvFixedRow(tokens int) CapacityRow {
	r := kvLearnedRow()
	r.Name = "fq-kv-" + strconv.Itoa(tokens)
	r.Label = "fair_queue kv_tokens, no max_tokens, default_max_tokens " + strconv.Itoa(tokens)
	r.DefaultMaxTokens = tokens
	return r
}
