package report

import (
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/fair-queue/caddy-fair-queue/bench/internal/systems"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestEvaluateComparesWithHAProxyAndReverseProxy(t *testing.T) {
	t.Parallel()
	res := &Results{Settings: DefaultSettings(true)}
	res.Systems = []*System{
		{Spec: systems.DefaultSpecs()[0], Saturated: &LoadRun{Throughput: 100, UpstreamMax: 4, HandoffCount: 9, HandoffP99: 1}},
		{Spec: systems.DefaultSpecs()[1], LowLoad: &LoadRun{P50: 1}, Saturated: &LoadRun{Throughput: 900, UpstreamMax: 64}},
		{Spec: systems.DefaultSpecs()[4], LowLoad: &LoadRun{P50: 1.1, ScriptsPerRequest: 2},
			Saturated: &LoadRun{Throughput: 96, UpstreamMax: 5, HandoffCount: 9, HandoffP99: 3, ScriptsPerRequest: 2.5}},
	}
	res.Waiters = []*WaiterRun{{System: "fq-redis-1", Waiters: 10, PromptBytes: 1024, Queued: 10, RampRPS: 500,
		RSSPerWaiter: 40, BaseWaiters: 10, BaseCmdsPerS: 50, IdleCmdsPerS: 200, UpstreamMax: 5, Served: 1}}
	got := map[string]string{}
	for _, c := range Evaluate(res) {
		got[c.Target+" "+c.System] = c.Result
	}
	assert.Equal(t, map[string]string{
		TargetHandoff + " haproxy":                                              "pass",
		TargetConcurrency + " haproxy":                                          "pass",
		TargetThroughput + " fq-redis-1":                                        "FAIL", // 0.96x
		TargetFastPath + " fq-redis-1":                                          "pass", // +0.1 ms
		TargetHandoff + " fq-redis-1":                                           "FAIL",
		TargetFastScripts + " fq-redis-1":                                       "pass",
		TargetQueueScripts + " fq-redis-1":                                      "pass",
		TargetConcurrency + " fq-redis-1":                                       "FAIL",
		TargetRSS + " fq-redis-1 (10 waiters, 1 KiB prompts, at 500/s)":         "pass",
		TargetConcurrency + " fq-redis-1 (10 waiters, 1 KiB prompts, at 500/s)": "FAIL", // a waiter got in
		TargetIdle + " fq-redis-1 (10 waiters, 1 KiB prompts, at 500/s)":        "FAIL",
	}, got)
}

func TestFastPathIsComparedWithAsManyNodes(t *testing.T) {
	t.Parallel()
	spec := func(name string) systems.Spec {
		for _, s := range systems.DefaultSpecs() {
			if s.Name == name {
				return s
			}
		}
		t.Fatalf("no spec %s", name)
		return systems.Spec{}
	}
	res := &Results{Settings: DefaultSettings(true)}
	res.Systems = []*System{
		{Spec: spec("caddy"), LowLoad: &LoadRun{P50: 1}},
		{Spec: spec("caddy-3"), LowLoad: &LoadRun{P50: 1.1}},
		{Spec: spec("fq-redis-1"), LowLoad: &LoadRun{P50: 1.25}},
		{Spec: spec("fq-redis-3"), LowLoad: &LoadRun{P50: 1.25}},
	}
	got := map[string]string{}
	for _, c := range Evaluate(res) {
		if c.Target == TargetFastPath {
			got[c.System] = c.Result + " " + c.Value
		}
	}
	assert.Equal(t, map[string]string{
		"fq-redis-1": "FAIL p50 +0.250 ms, p99 +0.000 ms (1.250 / 0.000 ms vs 1.000 / 0.000, Caddy reverse_proxy)",
		"fq-redis-3": "pass p50 +0.150 ms, p99 +0.000 ms (1.250 / 0.000 ms vs 1.100 / 0.000, Caddy reverse_proxy 3 nodes)",
	}, got)

	// Without the 3-node baseline, the single node is the reference.
	res.Systems = slices.Delete(res.Systems, 1, 2)
	for _, c := range Evaluate(res) {
		if c.Target == TargetFastPath && c.System == "fq-redis-3" {
			assert.Equal(t, "FAIL", c.Result, c.Value)
		}
	}
}

func TestBurstRunChecksOnlyAdmission(t *testing.T) {
	t.Parallel()
	res := &Results{Settings: DefaultSettings(false)}
	res.Waiters = []*WaiterRun{{System: "fq-redis-1", Waiters: 10000, PromptBytes: 1024, RampRPS: 2000,
		Burst: true, UpstreamMax: 188, Served: 2650, Note: "only 0 of 10000 waiters queued"}}
	checks := Evaluate(res)
	require.Len(t, checks, 1)
	assert.Equal(t, Check{
		Target: TargetConcurrency, System: "fq-redis-1 (10000 waiters, 1 KiB prompts, at 2000/s)",
		Value: "188 vs 4 (2650 waiters served, 0 failed while the permits were held)", Result: "FAIL",
	}, checks[0])
}

func TestReportAndPlotsAreWritten(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	run := &LoadRun{Throughput: 100, P50: 1, P99: 2, CDF: []float64{0.5, 1, 2, 4}, UpstreamMax: 4}
	res := &Results{Mode: "quick", Settings: DefaultSettings(true), Machine: Machine{CPUs: 2, Redis: "Redis server v=7.0.15 sha=0"}}
	res.Systems = []*System{
		{Spec: systems.DefaultSpecs()[0], LowLoad: run, Saturated: run, OpenLoop: []*RatePoint{{Rate: 10, WaitP50: 1}, {Rate: 20, WaitP50: 2}}},
		{Spec: systems.DefaultSpecs()[3], Error: "redis is required | local queue not yet available"},
	}
	res.Checks = Evaluate(res)
	plots, err := WritePlots(res, dir)
	require.NoError(t, err)
	assert.Equal(t, []string{PlotCDFSaturated, PlotCDFLowLoad, PlotWaitVsRate}, plots)
	for _, p := range plots {
		st, err := os.Stat(dir + "/" + p)
		require.NoError(t, err)
		assert.Positive(t, st.Size())
	}
	md := Markdown(res, Files{OutDir: "bench-results"}, plots)
	assert.Contains(t, md, "| 2 | ")
	assert.Contains(t, md, "| 7.0.15 |")
	assert.Contains(t, md, "redis is required / local queue")
	assert.Contains(t, md, "make bench-quick")
	assert.False(t, strings.Contains(md, "%!"), "no formatting errors")
}
