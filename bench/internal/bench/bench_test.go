package bench

import (
	"encoding/json"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestCommandStatsCountScriptsAndLeaveOutTheBenchsOwnCalls(t *testing.T) {
	t.Parallel()
	cs := parseCommandStats("# Commandstats\r\n" +
		"cmdstat_evalsha:calls=12,usec=340,usec_per_call=28.33,rejected_calls=0,failed_calls=0\r\n" +
		"cmdstat_eval:calls=1,usec=10,usec_per_call=10.00,rejected_calls=0,failed_calls=0\r\n" +
		"cmdstat_zadd:calls=7,usec=7,usec_per_call=1.00,rejected_calls=0,failed_calls=0\r\n" +
		"cmdstat_info:calls=3,usec=30,usec_per_call=10.00,rejected_calls=0,failed_calls=0\r\n" +
		"cmdstat_config|resetstat:calls=1,usec=5,usec_per_call=5.00,rejected_calls=0,failed_calls=0\r\n")
	assert.Equal(t, CommandStats{"evalsha": 12, "eval": 1, "zadd": 7, "info": 3, "config|resetstat": 1}, cs)
	assert.Equal(t, int64(13), cs.Scripts())
	assert.Equal(t, int64(20), cs.Total())
	assert.Equal(t, CommandStats{"evalsha": 2}, cs.Sub(CommandStats{"evalsha": 10, "eval": 1, "zadd": 7, "info": 3, "config|resetstat": 1}))
}

func TestCaddyConfigPutsFairQueueBeforeReverseProxy(t *testing.T) {
	t.Parallel()
	e := &Env{MockAddr: "127.0.0.1:9", RedisAddr: "127.0.0.1:7", Permits: 4, MaxWait: time.Minute}
	for _, tc := range []struct {
		spec     Spec
		handlers []string
		redis    bool
	}{
		{Spec{Name: "caddy", Kind: KindPlain}, []string{"reverse_proxy"}, false},
		{Spec{Name: "fq-local", Kind: KindFairQueue}, []string{"fair_queue", "reverse_proxy"}, false},
		{Spec{Name: "fq-redis-1", Kind: KindFairQueue, Redis: true}, []string{"fair_queue", "reverse_proxy"}, true},
	} {
		data, err := e.caddyConfig("127.0.0.1:8", tc.spec, "q")
		require.NoError(t, err)
		var cfg struct {
			Apps struct {
				HTTP struct {
					Servers map[string]struct {
						Listen []string `json:"listen"`
						Routes []struct {
							Handle []map[string]any `json:"handle"`
						} `json:"routes"`
					} `json:"servers"`
				} `json:"http"`
			} `json:"apps"`
		}
		require.NoError(t, json.Unmarshal(data, &cfg), tc.spec.Name)
		srv := cfg.Apps.HTTP.Servers["bench"]
		assert.Equal(t, []string{"127.0.0.1:8"}, srv.Listen)
		require.Len(t, srv.Routes, 1)
		var names []string
		for _, h := range srv.Routes[0].Handle {
			names = append(names, h["handler"].(string))
		}
		assert.Equal(t, tc.handlers, names, tc.spec.Name)
		if tc.spec.Kind == KindFairQueue {
			fq := srv.Routes[0].Handle[0]
			assert.EqualValues(t, 4, fq["permits"])
			assert.Equal(t, "1m0s", fq["max_wait"])
			_, hasRedis := fq["redis"]
			assert.Equal(t, tc.redis, hasRedis, tc.spec.Name)
		}
	}
}

func TestHAProxyConfigLimitsTheServerToThePermits(t *testing.T) {
	t.Parallel()
	e := &Env{MockAddr: "127.0.0.1:9", Permits: 4, MaxWait: time.Minute}
	cfg := e.haproxyConfig("127.0.0.1:8")
	assert.Contains(t, cfg, "server s1 127.0.0.1:9 maxconn 4")
	assert.Contains(t, cfg, "timeout queue 60000ms")
	assert.Contains(t, cfg, "bind 127.0.0.1:8")
	assert.Contains(t, cfg, "option http-no-delay")
}

func TestProcsStopEveryProcessTheyStarted(t *testing.T) {
	t.Parallel()
	ps := NewProcs(t.TempDir())
	a, err := ps.Start("a", "sleep", "60")
	require.NoError(t, err)
	b, err := ps.Start("b", "sh", "-c", "trap '' TERM; sleep 60") // ignores SIGTERM
	require.NoError(t, err)
	rss, err := RSS(a.PID())
	require.NoError(t, err)
	assert.Positive(t, rss)

	start := time.Now()
	ps.Stop(a)
	assert.True(t, a.Exited())
	assert.False(t, b.Exited())
	ps.StopAll()
	assert.True(t, b.Exited(), "killed after the grace period")
	assert.Less(t, time.Since(start), 10*time.Second)
}

func TestWaitListenReportsAProcessThatDied(t *testing.T) {
	t.Parallel()
	ps := NewProcs(t.TempDir())
	t.Cleanup(ps.StopAll)
	p, err := ps.Start("dies", "sh", "-c", "echo boom; exit 3")
	require.NoError(t, err)
	err = p.WaitListen(t.Context(), "127.0.0.1:1", 5*time.Second)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "boom")
}

func TestEstablishedCountsConnectionsToAPort(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { ln.Close() })
	port := ln.Addr().(*net.TCPAddr).Port
	for range 3 {
		c, err := net.Dial("tcp4", ln.Addr().String())
		require.NoError(t, err)
		t.Cleanup(func() { c.Close() })
	}
	n, err := Established(port)
	require.NoError(t, err)
	assert.Equal(t, 3, n)
}

func TestEvaluateComparesWithHAProxyAndReverseProxy(t *testing.T) {
	t.Parallel()
	res := &Results{Settings: settings(true)}
	res.Systems = []*System{
		{Spec: DefaultSpecs()[0], Saturated: &LoadRun{Throughput: 100, UpstreamMax: 4, HandoffCount: 9, HandoffP99: 1}},
		{Spec: DefaultSpecs()[1], LowLoad: &LoadRun{P50: 1}, Saturated: &LoadRun{Throughput: 900, UpstreamMax: 64}},
		{Spec: DefaultSpecs()[4], LowLoad: &LoadRun{P50: 1.1, ScriptsPerRequest: 2},
			Saturated: &LoadRun{Throughput: 96, UpstreamMax: 5, HandoffCount: 9, HandoffP99: 3, ScriptsPerRequest: 2.5}},
	}
	res.Waiters = []*WaiterRun{{System: "fq-redis-1", Waiters: 10, PromptBytes: 1024, Queued: 10, RampRPS: 500,
		RSSPerWaiter: 40, BaseWaiters: 10, BaseCmdsPerS: 50, IdleCmdsPerS: 200, UpstreamMax: 5, Served: 1}}
	got := map[string]string{}
	for _, c := range evaluate(res) {
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
	spec := func(name string) Spec {
		for _, s := range DefaultSpecs() {
			if s.Name == name {
				return s
			}
		}
		t.Fatalf("no spec %s", name)
		return Spec{}
	}
	res := &Results{Settings: settings(true)}
	res.Systems = []*System{
		{Spec: spec("caddy"), LowLoad: &LoadRun{P50: 1}},
		{Spec: spec("caddy-3"), LowLoad: &LoadRun{P50: 1.1}},
		{Spec: spec("fq-redis-1"), LowLoad: &LoadRun{P50: 1.25}},
		{Spec: spec("fq-redis-3"), LowLoad: &LoadRun{P50: 1.25}},
	}
	got := map[string]string{}
	for _, c := range evaluate(res) {
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
	for _, c := range evaluate(res) {
		if c.Target == TargetFastPath && c.System == "fq-redis-3" {
			assert.Equal(t, "FAIL", c.Result, c.Value)
		}
	}
}

func TestBurstRunChecksOnlyAdmission(t *testing.T) {
	t.Parallel()
	res := &Results{Settings: settings(false)}
	res.Waiters = []*WaiterRun{{System: "fq-redis-1", Waiters: 10000, PromptBytes: 1024, RampRPS: 2000,
		Burst: true, UpstreamMax: 188, Served: 2650, Note: "only 0 of 10000 waiters queued"}}
	checks := evaluate(res)
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
	res := &Results{Mode: "quick", Settings: settings(true), Machine: Machine{CPUs: 2, Redis: "Redis server v=7.0.15 sha=0"}}
	res.Systems = []*System{
		{Spec: DefaultSpecs()[0], LowLoad: run, Saturated: run, OpenLoop: []*RatePoint{{Rate: 10, WaitP50: 1}, {Rate: 20, WaitP50: 2}}},
		{Spec: DefaultSpecs()[3], Error: "redis is required | local queue not yet available"},
	}
	res.Checks = evaluate(res)
	plots, err := writePlots(res, dir)
	require.NoError(t, err)
	assert.Equal(t, []string{PlotCDFSaturated, PlotCDFLowLoad, PlotWaitVsRate}, plots)
	for _, p := range plots {
		st, err := os.Stat(dir + "/" + p)
		require.NoError(t, err)
		assert.Positive(t, st.Size())
	}
	md := markdown(res, Options{OutDir: "bench-results"}, plots)
	assert.Contains(t, md, "| 2 | ")
	assert.Contains(t, md, "| 7.0.15 |")
	assert.Contains(t, md, "redis is required / local queue")
	assert.Contains(t, md, "make bench-quick")
	assert.False(t, strings.Contains(md, "%!"), "no formatting errors")
}

func TestRenderRewritesTheReportFromResultsJSON(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	res := &Results{Mode: "full", Settings: settings(false), Machine: Machine{CPUs: 2}}
	res.Systems = []*System{
		{Spec: DefaultSpecs()[0], Saturated: &LoadRun{Throughput: 100, UpstreamMax: 4}},
		{Spec: DefaultSpecs()[0], SaturatedStream: &LoadRun{Throughput: 90, UpstreamMax: 5}},
	}
	data, err := json.Marshal(res)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(dir, "results.json"), data, 0o644))

	md := filepath.Join(dir, "BENCHMARKS.md")
	got, err := Render(Options{OutDir: dir, Markdown: md})
	require.NoError(t, err)
	assert.Equal(t, "full", got.Mode)
	report, err := os.ReadFile(md)
	require.NoError(t, err)
	assert.Contains(t, string(report), "| upstream max concurrency <= permits | haproxy (streamed) | 5 vs 4 | FAIL |",
		"the targets are evaluated again")
}
