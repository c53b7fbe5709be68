package scenario

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"slices"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fair-queue/caddy-fair-queue/bench/internal/procs"
	"github.com/fair-queue/caddy-fair-queue/bench/internal/report"
	"github.com/fair-queue/caddy-fair-queue/bench/internal/systems"
	"github.com/fair-queue/caddy-fair-queue/internal/loadgen"
	"github.com/fair-queue/caddy-fair-queue/internal/mockllm"
)

// Load runs one closed or open loop against targets and returns its
// report. The per-request timeout outlasts the longest queue wait.
func (b *Runner) Load(ctx context.Context, targets []string, cfg loadgen.Config) (*loadgen.Report, error) {
	cfg.Targets = targets
	if cfg.Timeout == 0 {
		cfg.Timeout = b.Env.MaxWait + 10*time.Second
	}
	r, err := loadgen.New(cfg)
	if err != nil {
		return nil, err
	}
	return r.Run(ctx)
}

// Warm opens connections and warms caches before a system is measured.
func (b *Runner) Warm(ctx context.Context, r *systems.Running) error {
	_, err := b.Load(ctx, r.Targets, loadgen.Config{
		Clients: 8, Duration: 300 * time.Millisecond, Tokens: 1, Delay: time.Millisecond,
	})
	return err
}

// Measure runs cfg against r with the upstream's and Redis' counters
// reset first, and returns what the load, the upstream and Redis saw.
func (b *Runner) Measure(ctx context.Context, r *systems.Running, cfg loadgen.Config) (*report.LoadRun, error) {
	if err := b.ResetCounters(ctx); err != nil {
		return nil, err
	}
	redisPID := 0
	if r.Spec.Redis {
		redisPID = b.RedisPID
	}
	cpu0 := sampleCPU(r.PIDs(), redisPID)
	rep, err := b.Load(ctx, r.Targets, cfg)
	if err != nil {
		return nil, err
	}
	// Releases run after the last answers reach the clients; their CPU
	// is the requests' too.
	time.Sleep(100 * time.Millisecond)
	cpu1 := sampleCPU(r.PIDs(), redisPID)
	st, err := b.MockStats(ctx)
	if err != nil {
		return nil, err
	}
	run := &report.LoadRun{
		Requests: rep.Sent, OK: rep.OK, Rejected: rep.Rejected, Failed: rep.Failed,
		Elapsed: report.Round(rep.Elapsed, 3), Throughput: rep.Throughput,
		P50: rep.Overall.Total.P50, P90: rep.Overall.Total.P90,
		P99: rep.Overall.Total.P99, Max: rep.Overall.Total.Max,
		CDF:         Quantiles(rep.Durations(), 200),
		UpstreamMax: st.MaxInFlight,
	}
	if err := recordCPU(run, cpu0, cpu1, rep.OK+rep.Rejected, r.Spec.Redis); err != nil {
		b.Logf("   CPU not measured: %v", err)
	}
	if (r.Spec.Limited() || cfg.Header.Get(mockllm.HeaderQueue) != "") && rep.Elapsed > 0 {
		run.Utilization = Utilization(st.BusyMS, b.Env.Permits, rep.Elapsed)
		gaps := make([]time.Duration, len(st.HandoffGapsUS))
		for i, us := range st.HandoffGapsUS {
			gaps[i] = time.Duration(us) * time.Microsecond
		}
		slices.Sort(gaps)
		run.HandoffCount = len(gaps)
		run.HandoffP50 = report.MSOf(loadgen.Percentile(gaps, 50))
		run.HandoffP99 = report.MSOf(loadgen.Percentile(gaps, 99))
	}
	if r.Spec.Redis && rep.Sent > 0 {
		cs, err := procs.ReadCommandStats(ctx, b.RDB)
		if err != nil {
			return nil, err
		}
		run.Commands = cs
		run.ScriptsPerRequest = report.Round(float64(cs.Scripts())/float64(rep.Sent), 2)
		run.CommandsPerRequest = report.Round(float64(cs.Total())/float64(rep.Sent), 2)
	}
	return run, nil
}

// MeasureSystem starts spec, runs the low-load, saturated and open-loop
// measurements on it and stops it.
func (b *Runner) MeasureSystem(ctx context.Context, spec systems.Spec) *report.System {
	sys := &report.System{Spec: spec}
	b.Logf("== %s", spec.Label)
	r, err := b.Env.Start(ctx, spec)
	if err != nil {
		sys.Error = err.Error()
		b.Logf("   not measured: %v", err)
		return sys
	}
	defer b.Env.Stop(r)
	if err := b.Warm(ctx, r); err != nil {
		sys.Error = err.Error()
		return sys
	}
	set := b.Res.Settings
	step := func(name string, cfg loadgen.Config) *report.LoadRun {
		if err != nil {
			return nil
		}
		var run *report.LoadRun
		run, err = b.Measure(ctx, r, cfg)
		if err == nil {
			err = ctx.Err()
		}
		if err == nil {
			b.Logf("   %-18s %6d req  %8.1f ok/s  p50 %7.2f ms  p99 %7.2f ms  upstream max %d  rejected %d failed %d  CPU/req proxy %.4f ms redis %.4f ms",
				name, run.Requests, run.Throughput, run.P50, run.P99, run.UpstreamMax, run.Rejected, run.Failed,
				run.ProxyCPUPerRequest, run.RedisCPUPerRequest)
		}
		return run
	}
	sys.LowLoad = step("low load", loadgen.Config{
		Clients: set.LowLoadClients, Duration: report.Secs(set.LowLoadS), Tokens: 1, Delay: 0,
	})
	sys.Saturated = step("saturated", loadgen.Config{
		Clients: set.Clients, Duration: report.Secs(set.SaturatedS), Tokens: 1, Delay: report.MS(set.ServiceMS),
	})
	short := func(name string, h http.Header) *report.LoadRun {
		if set.ShortServiceMS <= 0 {
			return nil
		}
		return step(fmt.Sprintf("%s %g ms", name, set.ShortServiceMS), loadgen.Config{
			Clients: set.Clients, Duration: report.Secs(set.SaturatedS), Tokens: 1, Delay: report.MS(set.ShortServiceMS),
			Header: h,
		})
	}
	if spec.Limited() {
		sys.SaturatedShort = short("saturated", nil)
	}
	if spec.Kind == systems.KindPlain {
		sys.AtPermits = step(fmt.Sprintf("%d clients", set.Permits), loadgen.Config{
			Clients: set.Permits, Duration: report.Secs(set.SaturatedS), Tokens: 1, Delay: report.MS(set.ServiceMS),
		})
		sys.UpstreamQueues = step("upstream queues", loadgen.Config{
			Clients: set.Clients, Duration: report.Secs(set.SaturatedS), Tokens: 1, Delay: report.MS(set.ServiceMS),
			Header: http.Header{mockllm.HeaderQueue: {"1"}},
		})
		if spec.Nodes == 1 {
			sys.UpstreamQueuesShort = short("upstream queues", http.Header{mockllm.HeaderQueue: {"1"}})
		}
	}
	if spec.BaselineOnly {
		if err != nil {
			sys.Error = err.Error()
			b.Logf("   failed: %v", err)
		}
		return sys
	}
	if set.StreamSaturated {
		sys.SaturatedStream = step("saturated stream", loadgen.Config{
			Clients: set.Clients, Duration: report.Secs(set.SaturatedS), Stream: true,
			Tokens: set.StreamTokens, Delay: report.MS(set.StreamTokenMS),
		})
	}
	if err == nil && b.openLoopFor(spec) {
		sys.OpenLoop, err = b.openLoop(ctx, r)
	}
	if err != nil {
		sys.Error = err.Error()
		b.Logf("   failed: %v", err)
	}
	return sys
}

// Calibrate measures the upstream alone with Permits clients, unstreamed
// and streamed: what a perfect limiter would let through.
func (b *Runner) Calibrate(ctx context.Context) error {
	set := &b.Res.Settings
	d := report.Secs(min(set.SaturatedS, 2))
	loads := []struct {
		cfg loadgen.Config
		rps *float64
	}{
		{loadgen.Config{Tokens: 1, Delay: report.MS(set.ServiceMS)}, &set.UpstreamRPS},
		{loadgen.Config{Stream: true, Tokens: set.StreamTokens, Delay: report.MS(set.StreamTokenMS)}, &set.UpstreamStreamRPS},
		{loadgen.Config{Tokens: 1, Delay: report.MS(set.ShortServiceMS)}, &set.UpstreamShortRPS},
	}
	for i, l := range loads {
		if i == 2 && set.ShortServiceMS <= 0 {
			continue
		}
		l.cfg.Clients, l.cfg.Duration = b.Env.Permits, d
		rep, err := b.Load(ctx, []string{b.MockURL}, l.cfg)
		if err != nil {
			return err
		}
		*l.rps = rep.Throughput
	}
	b.Logf("upstream alone, %d clients: %.1f req/s unstreamed, %.1f req/s streamed, %.1f req/s at %g ms",
		b.Env.Permits, set.UpstreamRPS, set.UpstreamStreamRPS, set.UpstreamShortRPS, set.ShortServiceMS)
	busy, _, err := redisRTT(ctx, b.RDB, 2000, 0)
	if err != nil {
		return fmt.Errorf("redis round trip: %w", err)
	}
	p50, p99, err := redisRTT(ctx, b.RDB, 1000, 500*time.Microsecond)
	if err != nil {
		return fmt.Errorf("redis round trip: %w", err)
	}
	set.RedisRTTP50MS, set.RedisRTTP99MS, set.RedisRTTBusyP50MS = report.Round(p50, 3), report.Round(p99, 3), report.Round(busy, 3)
	b.Logf("Redis round trip (one script call): p50 %.3f ms, p99 %.3f ms after 0.5 ms idle; p50 %.3f ms back to back",
		p50, p99, busy)
	return nil
}

// RTTScript is a script that does nothing: its call is the round trip.
var RTTScript = redis.NewScript("return 1")

// redisRTT times n script calls, each after pause; it returns their p50
// and p99 in milliseconds.
func redisRTT(ctx context.Context, rdb *redis.Client, n int, pause time.Duration) (p50, p99 float64, err error) {
	if err := RTTScript.Load(ctx, rdb).Err(); err != nil {
		return 0, 0, err
	}
	d := make([]float64, n)
	for i := range d {
		if pause > 0 {
			time.Sleep(pause)
		}
		t0 := time.Now()
		if err := RTTScript.EvalSha(ctx, rdb, nil).Err(); err != nil {
			return 0, 0, err
		}
		d[i] = time.Since(t0).Seconds() * 1000
	}
	slices.Sort(d)
	return d[n/2], d[n*99/100], nil
}

// openLoop measures the wait at each arrival rate of the settings.
func (b *Runner) openLoop(ctx context.Context, r *systems.Running) ([]*report.RatePoint, error) {
	set := b.Res.Settings
	capacity := set.UpstreamStreamRPS
	if capacity <= 0 {
		capacity = float64(b.Env.Permits) / (float64(set.StreamTokens) * set.StreamTokenMS / 1000)
	}
	var points []*report.RatePoint
	for _, load := range set.OpenLoopLoads {
		rate := math.Round(load * capacity)
		rep, err := b.Load(ctx, r.Targets, loadgen.Config{
			Rate: rate, Duration: report.Secs(set.OpenLoopS), Stream: true,
			Tokens: set.StreamTokens, Delay: report.MS(set.StreamTokenMS),
		})
		if err == nil {
			err = ctx.Err()
		}
		if err != nil {
			return points, err
		}
		p := &report.RatePoint{
			Rate: rate, Load: load, Sent: rep.Sent, OK: rep.OK, Rejected: rep.Rejected, Failed: rep.Failed,
			Throughput: rep.Throughput, WaitP50: rep.Overall.TTFB.P50, WaitP99: rep.Overall.TTFB.P99,
		}
		points = append(points, p)
		b.Logf("   open loop %4.0f/s  (load %.2f)  wait p50 %7.2f ms  p99 %7.2f ms  ok %d rejected %d failed %d",
			rate, load, p.WaitP50, p.WaitP99, p.OK, p.Rejected, p.Failed)
		time.Sleep(200 * time.Millisecond) // let a backlog drain
	}
	return points, nil
}

// ResetCounters zeroes mockllm's stats and Redis' command statistics.
func (b *Runner) ResetCounters(ctx context.Context) error {
	if err := b.ResetMock(ctx); err != nil {
		return fmt.Errorf("reset mockllm stats: %w", err)
	}
	if err := b.RDB.ConfigResetStat(ctx).Err(); err != nil {
		return fmt.Errorf("redis CONFIG RESETSTAT: %w", err)
	}
	return nil
}

// MockStats reads mockllm's /stats, timeline included.
func (b *Runner) MockStats(ctx context.Context) (mockllm.Stats, error) {
	var st mockllm.Stats
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, b.MockURL+"/stats", nil)
	if err != nil {
		return st, err
	}
	resp, err := b.HC.Do(req)
	if err != nil {
		return st, fmt.Errorf("mockllm stats: %w", err)
	}
	defer resp.Body.Close()
	return st, json.NewDecoder(resp.Body).Decode(&st)
}

// Quantiles returns n evenly spaced quantiles (1/n ... 1) of sorted ds, in
// ms.
func Quantiles(sorted []time.Duration, n int) []float64 {
	if len(sorted) == 0 {
		return nil
	}
	out := make([]float64, n)
	for i := range n {
		out[i] = report.MSOf(loadgen.Percentile(sorted, 100*float64(i+1)/float64(n)))
	}
	return out
}

// ResetMock zeroes mockllm's stats only.
func (b *Runner) ResetMock(ctx context.Context) error {
	return b.Post(ctx, b.MockURL+"/stats/reset")
}

// Post posts an empty body to url and fails unless the answer is 200.
func (b *Runner) Post(ctx context.Context, url string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, nil)
	if err != nil {
		return err
	}
	resp, err := b.HC.Do(req)
	if err != nil {
		return err
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s: status %d", url, resp.StatusCode)
	}
	return nil
}

// Utilization is busy permit-time (ms) / (permits x wall time (s)),
// rounded to 3 digits; 0 without a wall time.
func Utilization(busyMS float64, permits int, elapsedS float64) float64 {
	if permits <= 0 || elapsedS <= 0 {
		return 0
	}
	return report.Round(busyMS/(float64(permits)*elapsedS*1000), 3)
}
