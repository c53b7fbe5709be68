package report

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/fair-queue/caddy-fair-queue/bench/internal/systems"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// llmFixture is a scenario result: HAProxy and one fair_queue system at
// two loads.
func llmFixture(fqUtil, fqWaitP99 float64) *LLM {
	set := DefaultLLMSettings(false)
	set.Loads = []float64{0.7, 1.1}
	point := func(load, util, p99 float64, upMax int) *LLMPoint {
		return &LLMPoint{Load: load, Sent: 200, OK: 200, Utilization: util, WaitP50: p99 / 10, WaitP99: p99,
			UpstreamMax: upMax, ElapsedS: 50}
	}
	return &LLM{
		Settings: set,
		Levels:   []*LLMLevel{{Load: 0.7, Arrivals: 170}, {Load: 1.1, Arrivals: 270}},
		Systems: []*LLMSystem{
			{Spec: systems.Spec{Name: "haproxy", Label: "HAProxy maxconn", Kind: systems.KindHAProxy}, Points: []*LLMPoint{
				point(0.7, 0.60, 4000, 8), point(1.1, 0.90, 12000, 8)}},
			{Spec: systems.Spec{Name: "fq-local", Label: "fair_queue local", Kind: systems.KindFairQueue}, Points: []*LLMPoint{
				point(0.7, 0.60*fqUtil, 4000*fqWaitP99, 8), point(1.1, 0.90*fqUtil, 12000*fqWaitP99, 9)}},
		},
	}
}

func TestLLMChecks(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name             string
		util, wait       float64
		wantUtil, wantWt string
	}{
		{"as good as HAProxy", 1.0, 1.0, "pass", "pass"},
		{"within the targets", 0.995, 1.09, "pass", "pass"},
		{"idle permits", 0.97, 1.0, "FAIL", "pass"},
		{"longer waits", 1.0, 1.25, "pass", "FAIL"},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			checks := llmChecks(llmFixture(c.util, c.wait))
			got := map[string]string{}
			for _, ch := range checks {
				got[ch.Target+" "+ch.System] = ch.Result
			}
			for _, load := range []string{"0.70", "1.10"} {
				sys := "fq-local (LLM load " + load + ")"
				assert.Equal(t, c.wantUtil, got[TargetLLMUtil+" "+sys], sys)
				assert.Equal(t, c.wantWt, got[TargetLLMWait+" "+sys], sys)
			}
			// No target rows for HAProxy itself, the reference.
			_, ok := got[TargetLLMUtil+" haproxy (LLM load 0.70)"]
			assert.False(t, ok)
			// Upstream concurrency is checked for every system and load.
			assert.Equal(t, "pass", got[TargetConcurrency+" haproxy (LLM load 1.10)"])
			assert.Equal(t, "FAIL", got[TargetConcurrency+" fq-local (LLM load 1.10)"], "9 > 8 permits")
		})
	}

	noHA := llmFixture(1, 1)
	noHA.Systems = noHA.Systems[1:]
	for _, ch := range llmChecks(noHA) {
		if ch.Target == TargetLLMUtil || ch.Target == TargetLLMWait {
			assert.Equal(t, "n/a", ch.Result, "without HAProxy")
		}
	}
	assert.Nil(t, llmChecks(nil))
}

func TestLLMReportAndPlots(t *testing.T) {
	t.Parallel()
	l := llmFixture(0.98, 1.2)
	var b strings.Builder
	llmMarkdown(&b, l, []string{PlotLLMWait})
	md := b.String()
	assert.Contains(t, md, "## LLM-shaped load")
	assert.Contains(t, md, "| fair_queue local | 1.10 | 200 | 0 | 0 | 0 | 0.882 | 0.980x | 1440.0 | 14400.0 | 1.200x |")
	assert.Contains(t, md, "| HAProxy maxconn | 0.70 | 200 | 0 | 0 | 0 | 0.600 |  | 400.0 | 4000.0 |  |")
	assert.Contains(t, md, "Plot (Wait p50 and p99 vs load, per system): `"+PlotLLMWait+"`")
	assert.NotContains(t, md, "](", "no link to a plot: they are not committed")

	dir := t.TempDir()
	written, err := writeLLMPlots(l, dir)
	require.NoError(t, err)
	assert.Equal(t, []string{PlotLLMWait, PlotLLMUtil}, written)
	for _, f := range written {
		st, err := os.Stat(filepath.Join(dir, f))
		require.NoError(t, err)
		assert.Positive(t, st.Size())
	}
	written, err = writeLLMPlots(nil, dir)
	assert.NoError(t, err)
	assert.Empty(t, written)
}

func TestLLMSettingsMatchTheIssue(t *testing.T) {
	t.Parallel()
	for _, quick := range []bool{false, true} {
		set := DefaultLLMSettings(quick)
		assert.Equal(t, 8, set.Permits)
		assert.Equal(t, 1000.0, set.MedianMS)
		assert.Equal(t, 10000.0, set.P99MS)
		assert.Equal(t, 20.0, set.TokenMS)
		assert.Equal(t, 1<<10, set.MinPromptBytes)
		assert.Equal(t, 32<<10, set.MaxPromptBytes)
		assert.GreaterOrEqual(t, set.MaxWaitS, 300.0)
		if quick {
			assert.Equal(t, []float64{1.0}, set.Loads)
			assert.LessOrEqual(t, set.ArrivalsS, 10.0)
		} else {
			assert.Equal(t, []float64{0.7, 0.9, 1.0, 1.1}, set.Loads)
			assert.Equal(t, 40.0, set.ArrivalsS)
		}
	}
}
