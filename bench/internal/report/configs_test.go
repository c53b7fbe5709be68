package report

import (
	"strings"
	"testing"

	"github.com/fair-queue/caddy-fair-queue/bench/internal/systems"
	"github.com/stretchr/testify/assert"
)

func TestConfigChecksUseTheMedianRoundAndEachTopologysTarget(t *testing.T) {
	t.Parallel()
	spec := func(name string, redis bool, nodes int) systems.Spec {
		return systems.Spec{Name: name, Kind: systems.KindFairQueue, Redis: redis, Nodes: nodes}
	}
	runs := func(rps ...float64) []*LoadRun {
		var out []*LoadRun
		for _, r := range rps {
			out = append(out, &LoadRun{Throughput: r})
		}
		return out
	}
	cs := &Configs{Rounds: 3, Systems: []*ConfigSystem{
		{Spec: systems.Spec{Name: "haproxy", Kind: systems.KindHAProxy, Nodes: 1}, Runs: runs(100, 200, 100)},
		{Spec: spec("fq-local", false, 1), Runs: runs(100, 190, 101)},    // 1.00, 0.95, 1.01: median 1.00
		{Spec: spec("fq-redis-1", true, 1), Runs: runs(96, 200, 99)},     // 0.96, 1.00, 0.99: median 0.99
		{Spec: spec("fq-local-cf", false, 1), Runs: runs(99, 198, 99)},   // median 0.99 < 1.00
		{Spec: spec("fq-redis-3-cf", true, 3), Runs: runs(94, 188, 100)}, // 0.94, 0.94, 1.00: median 0.94
		{Spec: spec("fq-redis-3", true, 3), Runs: runs(96, 192, 96)},     // median 0.96 >= 0.95
		{Spec: spec("fq-redis-1-cf", true, 1), Error: "boom"},
	}}
	cs.SetRatios()
	assert.Equal(t, []float64{1, 0.95, 1.01}, cs.System("fq-local").Ratios)
	got := map[string]string{}
	for _, c := range configChecks(cs) {
		assert.Equal(t, TargetThroughput, c.Target)
		got[c.System] = c.Result
	}
	assert.Equal(t, map[string]string{
		"fq-local (alternated)":      "pass", // 1.00 >= 1.00
		"fq-local-cf (alternated)":   "FAIL", // 0.99 < 1.00
		"fq-redis-1 (alternated)":    "pass", // 0.99 >= 0.97
		"fq-redis-3-cf (alternated)": "FAIL", // 0.94 < 0.95
		"fq-redis-3 (alternated)":    "pass", // 0.96 >= 0.95
		"fq-redis-1-cf (alternated)": "FAIL", // not measured
	}, got)
	var b strings.Builder
	configsMarkdown(&b, cs, DefaultSettings(false))
	assert.Contains(t, b.String(), "0.960, 1.000, 0.990 | 0.990x")
	assert.Contains(t, b.String(), "not measured: `boom`")
}

func TestThroughputTargets(t *testing.T) {
	t.Parallel()
	assert.Equal(t, 1.00, throughputTarget(systems.Spec{Kind: systems.KindFairQueue, Nodes: 1}))
	assert.Equal(t, 0.97, throughputTarget(systems.Spec{Kind: systems.KindFairQueue, Nodes: 1, Redis: true}))
	assert.Equal(t, 0.95, throughputTarget(systems.Spec{Kind: systems.KindFairQueue, Nodes: 3, Redis: true}))
	assert.Equal(t, 2.0, median([]float64{3, 1, 2}))
	assert.Equal(t, 2.5, median([]float64{4, 1, 2, 3}))
}
