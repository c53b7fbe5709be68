package report

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func fairnessFixture() *Fairness {
	set := DefaultFairnessSettings(true)
	f := &Fairness{Settings: set, System: "fair_queue Redis 2 nodes, 2 permits"}
	nw := int(set.DurationS / set.WindowS)
	shares := func(v float64) []float64 {
		s := make([]float64, nw)
		for i := range s {
			s[i] = v
		}
		return s
	}
	for _, m := range FairModes() {
		run := &FairRun{Mode: m, UpstreamMax: 2}
		long, short := 0.76, 0.19
		if m.Cost == "time" {
			long, short = 0.36, 0.34
		}
		if m.Cost == "tokens" {
			long, short = 0.45, 0.30
		}
		run.Tenants = []*FairTenant{
			{Tenant: TenantLong, PermitS: long * 8, PermitShare: long, Requests: 40, RequestShare: 0.4, Shares: shares(long)},
			{Tenant: TenantShort, PermitS: short * 8, PermitShare: short, Requests: 40, RequestShare: 0.4, Shares: shares(short)},
			{Tenant: TenantChat, PermitS: (1 - long - short) * 8, PermitShare: 1 - long - short, Requests: 20, RequestShare: 0.2,
				Shares: shares(1 - long - short), WaitP50: 12, WaitP99: 70},
		}
		f.Runs = append(f.Runs, run)
	}
	return f
}

func TestFairnessChecksReportTheHeavyTenantsSplit(t *testing.T) {
	t.Parallel()
	got := map[string]string{}
	for _, c := range fairnessChecks(fairnessFixture()) {
		got[c.Target] = c.Result + " " + c.Value
	}
	assert.Equal(t, map[string]string{
		TargetFairTime:   "pass long 51.4%, short 48.6% of their permit-time (2.9 / 2.7 s; 36.0% / 34.0% of all, chat 30.0%)",
		TargetFairTokens: "FAIL long 60.0%, short 40.0% of their permit-time (3.6 / 2.4 s; 45.0% / 30.0% of all, chat 25.0%)",
	}, got)
}

func TestFairnessSectionAndPlotAreWritten(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	res := &Results{Mode: "quick", Settings: DefaultSettings(true), Machine: Machine{CPUs: 2}, Fairness: fairnessFixture()}
	res.Fairness.Runs[3].Error = "cost: unknown mode | tokens"
	res.Checks = Evaluate(res)
	plots, err := WritePlots(res, dir)
	require.NoError(t, err)
	assert.Equal(t, []string{PlotFairness}, plots)
	st, err := os.Stat(filepath.Join(dir, PlotFairness))
	require.NoError(t, err)
	assert.Positive(t, st.Size())

	md := Markdown(res, Files{OutDir: "bench-results", Markdown: "BENCHMARKS.md"}, plots)
	assert.Contains(t, md, "## Fairness")
	assert.Contains(t, md, "**strict FIFO (no tenant)** (long 80.0% / short 20.0%")
	assert.Contains(t, md, "| chat | 1 | 0.40 | 5.0% | 20 | 20.0% |")
	assert.Contains(t, md, "**cost tokens**: not measured: `cost: unknown mode / tokens`")
	assert.Contains(t, md, "`bench-results/"+PlotFairness+"`, written by the run, not committed")
	assert.NotContains(t, md, "](", "no link to a plot: they are not committed")
	assert.Contains(t, md, "long down to 36% and (not run)")
	assert.Contains(t, md, "| "+TargetFairTokens+" | fair_queue Redis 2 nodes, 2 permits (cost tokens) | not measured")
	assert.False(t, strings.Contains(md, "%!"), "no formatting errors")
}
