package report

import (
	"strings"
	"testing"

	"github.com/fair-queue/caddy-fair-queue/bench/internal/systems"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestCPUTargetComparesWithReverseProxyUnderTheSameLoad(t *testing.T) {
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
	cpu := func(proxy, redis float64) *LoadRun {
		return &LoadRun{Throughput: 100, ProxyCPUPerRequest: proxy, RedisCPUPerRequest: redis}
	}
	res := &Results{Settings: DefaultSettings(true)}
	res.Systems = []*System{
		{Spec: spec("haproxy"), LowLoad: cpu(0.05, 0), Saturated: cpu(0.04, 0)},
		// Saturated, unlimited, costs less per request than the same
		// load against an upstream that queues: the latter is the
		// reference; AtPermits (no waiting client) is reported.
		{Spec: spec("caddy"), LowLoad: cpu(0.1, 0), Saturated: cpu(0.03, 0), AtPermits: cpu(0.092, 0), UpstreamQueues: cpu(0.08, 0)},
		{Spec: spec("caddy-3"), LowLoad: cpu(0.2, 0), Saturated: cpu(0.04, 0), AtPermits: cpu(0.1, 0), UpstreamQueues: cpu(0.1, 0)},
		{Spec: spec("fq-local"), LowLoad: cpu(0.115, 0), Saturated: cpu(0.1, 0)},
		{Spec: spec("fq-redis-1"), LowLoad: cpu(0.11, 0.05), Saturated: cpu(0.092, 0.05)},
		{Spec: spec("fq-redis-3"), LowLoad: cpu(0.22, 0.1), Saturated: &LoadRun{Throughput: 90}},
	}
	got := map[string]string{}
	for _, c := range Evaluate(res) {
		if c.Target == TargetCPU {
			got[c.System] = c.Result
		}
	}
	assert.Equal(t, map[string]string{
		"fq-local (low load)":    "pass", // 1.15x
		"fq-local (saturated)":   "FAIL", // 1.25x
		"fq-redis-1 (low load)":  "pass", // 1.10x, Redis reported only
		"fq-redis-1 (saturated)": "pass", // 1.15x
		"fq-redis-3 (low load)":  "pass", // 1.10x of the 3-node reverse_proxy, not 2.2x of the single node
		// fq-redis-3 saturated: CPU not measured, no row.
		"fq-local (saturated, vs no waiting clients)":   "reported", // 1.09x
		"fq-redis-1 (saturated, vs no waiting clients)": "reported", // 1.00x
	}, got)
	for _, c := range Evaluate(res) {
		switch {
		case c.Target == TargetCPU && c.System == "fq-redis-1 (low load)":
			assert.Equal(t, "proxy 0.1100 vs 0.1000 ms/req = 1.10x; proxy+Redis 0.1600 ms/req = 1.60x (Caddy reverse_proxy; 100 vs 100 req/s)", c.Value)
		case c.Target == TargetCPU && c.System == "fq-redis-1 (saturated)":
			assert.Equal(t, "proxy 0.0920 vs 0.0800 ms/req = 1.15x; proxy+Redis 0.1420 ms/req = 1.78x (Caddy reverse_proxy, the upstream queueing; 100 vs 100 req/s)", c.Value)
		case c.Target == TargetCPU && c.System == "fq-redis-1 (saturated, vs no waiting clients)":
			assert.Equal(t, "proxy 0.0920 vs 0.0920 ms/req = 1.00x; proxy+Redis 0.1420 ms/req = 1.54x (Caddy reverse_proxy, as many clients as permits; 100 vs 100 req/s)", c.Value)
		}
	}

	// A run without UpstreamQueues (before it was measured): the
	// saturated load has no reference, the unlimited load is not one.
	for _, s := range res.Systems {
		s.UpstreamQueues = nil
	}
	found := false
	for _, c := range Evaluate(res) {
		if c.Target == TargetCPU && c.System == "fq-redis-1 (saturated)" {
			found = true
			assert.Equal(t, "n/a", c.Result, c.Value)
		}
	}
	assert.True(t, found, "the saturated row stays, without a reference")

	// Without a reverse_proxy run there is nothing to compare with.
	res.Systems = res.Systems[3:4]
	checks := Evaluate(res)
	var cpuChecks []Check
	for _, c := range checks {
		if c.Target == TargetCPU {
			cpuChecks = append(cpuChecks, c)
		}
	}
	require.Len(t, cpuChecks, 3)
	assert.Equal(t, "n/a", cpuChecks[0].Result)

	md := Markdown(&Results{Settings: DefaultSettings(true), Systems: []*System{
		{Spec: spec("caddy"), LowLoad: cpu(0.1, 0), Saturated: cpu(0.03, 0), AtPermits: cpu(0.09, 0), UpstreamQueues: cpu(0.08, 0)},
		{Spec: spec("fq-redis-1"), LowLoad: cpu(0.12, 0.05), Saturated: cpu(0.092, 0.06)},
	}}, Files{OutDir: "bench-results"}, nil)
	assert.Contains(t, md, "| 0.1200 | 0.0500 | 1.20x (1.70x with Redis) |", "low-load row")
	assert.Contains(t, md, "| 0.0920 | 0.0600 | 1.15x (1.90x with Redis) |", "saturated row")
	assert.Contains(t, md, "Caddy reverse_proxy 100.0 req/s, p50 0.00 ms, proxy CPU 0.0900 ms / req")
	assert.Contains(t, md, "Caddy reverse_proxy 100.0 req/s, p50 0.00 ms, upstream max 0, handoff p50 / p99 0.000 / 0.000 ms (inside the upstream), proxy CPU 0.0800 ms / req")
}

func TestShortServiceLoadIsCheckedAgainstHAProxysAndReportsTheHandoffBreakdown(t *testing.T) {
	t.Parallel()
	specs := systems.DefaultSpecs()
	res := &Results{Settings: DefaultSettings(true)}
	handoff := func(rps, p50 float64) *LoadRun {
		return &LoadRun{Throughput: rps, UpstreamMax: 4, HandoffCount: 100, HandoffP50: p50, HandoffP99: 3 * p50}
	}
	res.Systems = []*System{
		{Spec: specs[0], Saturated: handoff(350, 0.4), SaturatedShort: handoff(1500, 0.2)},
		{Spec: specs[1], UpstreamQueues: handoff(370, 0.07), UpstreamQueuesShort: handoff(1600, 0.07)},
		{Spec: specs[3], Saturated: handoff(350, 0.5), SaturatedShort: handoff(1480, 0.35)}, // local
		{Spec: specs[4], Saturated: handoff(340, 0.8), SaturatedShort: handoff(1350, 0.6)},  // Redis 1 node
		{Spec: specs[5], Saturated: handoff(330, 1.1), SaturatedShort: handoff(1200, 0.9)},  // Redis 3 nodes
	}
	got := map[string]string{}
	for _, c := range Evaluate(res) {
		if c.Target == TargetShort || c.Target == TargetHandoffRatio {
			got[c.Target+" "+c.System] = c.Result
		}
	}
	assert.Equal(t, map[string]string{
		TargetShort + " fq-local":                  "pass",     // 0.987x
		TargetShort + " fq-redis-1":                "FAIL",     // 0.90x
		TargetShort + " fq-redis-3":                "reported", // 0.80x
		TargetHandoffRatio + " fq-local (10 ms)":   "pass",     // 1.25x
		TargetHandoffRatio + " fq-local (2 ms)":    "FAIL",     // 1.75x
		TargetHandoffRatio + " fq-redis-1 (10 ms)": "pass",     // 2.0x
		TargetHandoffRatio + " fq-redis-1 (2 ms)":  "FAIL",     // 3.0x
		TargetHandoffRatio + " fq-redis-3 (10 ms)": "FAIL",     // 2.75x
		TargetHandoffRatio + " fq-redis-3 (2 ms)":  "FAIL",     // 4.5x
	}, got)

	md := Markdown(res, Files{OutDir: "bench-results"}, nil)
	assert.Contains(t, md, "## Saturated: 64 clients, 4 permits, 2 ms upstream")
	assert.Contains(t, md, "| system | 10 ms upstream | 2 ms upstream |")
	assert.Contains(t, md, "| fair_queue Redis 1 node | 0.800 / 2.400 (+0.300) | 0.600 / 1.800 (+0.250) |")
	assert.Contains(t, md, "hands on inside the upstream: 0.070 / 0.210 ms at 10 ms, 0.070 / 0.210 ms at 2 ms.")
	assert.False(t, strings.Contains(md, "%!"), "no formatting errors")
}
