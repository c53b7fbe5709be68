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
	assert.Contains(t, md, "![KV tokens")
	checks := capacityChecks(c)
	assert.Equal(t, verdict(true), checks[0].Result)
	require.Len(t, checks, 3)
	assert.Equal(t, TargetCapacityAdaptive, checks[2].Target)
	assert.Equal(t, TargetCapacityTokens, checks[1].Target)
	assert.Contains(t, checks[1].Value, "vs permits 32")
	assert.Equal(t, verdict(false), checks[1].Result, "1.03x the best fixed permits' goodput is short of 1.2x")
	assert.Contains(t, md, "| fair_queue kv_tokens (KV size) |", "the kv_tokens row is not marked best")
}
