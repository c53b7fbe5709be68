package report

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestCapacityReportAndPlots(t *testing.T) {
	set := DefaultCapacitySettings(true)
	// The plan's figures (scenario.capacityPlan), rounded.
	ideal := Ideal{Batch: []float64{60}, CapacityTPS: 3000, GoodputTPS: 2500, TTFTP50MS: 20, TTFTP99MS: 120}
	cs := &CapacityCase{Topology: "one", Workload: "mixed", Requests: 200, RateRPS: 40, Ideal: ideal}
	for i, row := range set.Rows {
		cs.Runs = append(cs.Runs, &CapacityRun{Row: row, GoodputTPS: float64(100 + i), VsIdeal: 0.5, MaxKVUsed: []int{48_000},
			Samples: []CapacitySample{{AtS: 0}, {AtS: 1, KVUsed: 100, Running: 3, Waiting: 2}}})
	}
	cs.BestPermits, cs.WorstPermits = 32, 8 // the sweep's ends (scenario.sweepEnds)
	c := &Capacity{Settings: set, Cases: []*CapacityCase{cs}}
	dir := t.TempDir()
	files, err := writeCapacityPlots(c, dir)
	require.NoError(t, err)
	require.Equal(t, []string{"capacity-one-mixed.png"}, files)
	_, err = os.Stat(filepath.Join(dir, files[0]))
	require.NoError(t, err)
	var b strings.Builder
	capacityMarkdown(&b, c, map[string]string{files[0]: "x/" + files[0]})
	md := b.String()
	assert.Contains(t, md, "Best fixed permits: **32** per replica; worst: 8.")
	assert.Contains(t, md, "Plot (KV tokens, running and waiting over time")
	assert.NotContains(t, md, "](", "no link to a plot: they are not committed")
	checks := capacityChecks(c)
	assert.Equal(t, verdict(true), checks[0].Result)
	require.Len(t, checks, 3)
	assert.Equal(t, TargetCapacityAdaptive, checks[2].Target)
	assert.Equal(t, TargetCapacityTokens, checks[1].Target)
	assert.Contains(t, checks[1].Value, "vs permits 32")
	assert.Equal(t, verdict(false), checks[1].Result, "1.03x the best fixed permits' goodput is short of 1.2x")
	assert.Contains(t, md, "| fair_queue kv_tokens (KV size) |", "the kv_tokens row is not marked best")
}

func TestCapacityReportSaysTheBudgetOfTheRowsWithoutMaxTokens(t *testing.T) {
	set := DefaultCapacitySettings(false)
	set.Topologies, set.Workloads = set.Topologies[:1], set.Workloads[:1]
	cs := &CapacityCase{Topology: "one", Workload: "mixed", Ideal: Ideal{GoodputTPS: 1000, TTFTP99MS: 100}, BestPermits: 32, WorstPermits: 32}
	for _, row := range set.Rows {
		r := &CapacityRun{Row: row, GoodputTPS: 500, Sent: 100}
		if row.NoMaxTokens {
			r.GoodputTPS = 999 // neither is the kv_tokens row of the check
		}
		if row.Name == "fq-kv-learned" {
			r.CompletionBudget, r.BudgetAnswers = 187, 950
		}
		cs.Runs = append(cs.Runs, r)
	}
	c := &Capacity{Settings: set, Cases: []*CapacityCase{cs}}
	var b strings.Builder
	capacityMarkdown(&b, c, nil)
	md := b.String()
	assert.Contains(t, md, "Rows labelled *no max_tokens*")
	assert.Contains(t, md, "fair_queue kv_tokens, no max_tokens, budget learned: learned **187** tokens from 950 answers")
	assert.Contains(t, md, "fair_queue kv_tokens, no max_tokens, default_max_tokens 1024: fixed at 1024 tokens")
	assert.Equal(t, "fq-kv", cs.kvTokens().Row.Name)
	for _, ch := range capacityChecks(c) {
		if ch.Target == TargetCapacityTokens {
			assert.Contains(t, ch.Value, "1.00x goodput", "fq-kv's, not a row without max_tokens")
		}
	}
}
