// Package bench measures fair_queue side by side with HAProxy and plain
// Caddy reverse_proxy on one machine, and ties a run together: it
// starts mockllm and redis-server on free loopback ports (package
// procs), runs the scenarios (package scenario and its subpackages) on
// the systems under test (package systems), each driven by package
// loadgen, and writes results.json, PNG plots and BENCHMARKS.md
// (package report). The bench command (bench/main.go) is its command
// line (make bench, make bench-quick).
//
// Every process it starts runs in its own process group, dies with the
// bench (Pdeathsig), and is stopped before Run returns.
package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"time"

	"github.com/fair-queue/caddy-fair-queue/bench/internal/procs"
	"github.com/fair-queue/caddy-fair-queue/bench/internal/report"
	"github.com/fair-queue/caddy-fair-queue/bench/internal/scenario"
	"github.com/fair-queue/caddy-fair-queue/bench/internal/scenario/capacity"
	"github.com/fair-queue/caddy-fair-queue/bench/internal/scenario/configs"
	"github.com/fair-queue/caddy-fair-queue/bench/internal/scenario/fairness"
	"github.com/fair-queue/caddy-fair-queue/bench/internal/scenario/llm"
	"github.com/fair-queue/caddy-fair-queue/bench/internal/scenario/scale"
	"github.com/fair-queue/caddy-fair-queue/bench/internal/systems"
	"github.com/redis/go-redis/v9"
)

// Options configure a run.
type Options struct {
	// Quick selects short loads, 2,000 waiters and the capacity
	// scenario's short version (about 4 minutes);
	// otherwise longer loads, more arrival rates, a streaming saturated
	// load and 10,000 waiters.
	Quick bool
	// Caddy and MockLLM are the paths of the binaries (bin/caddy,
	// bin/mockllm).
	Caddy, MockLLM string
	// OutDir receives results.json, the plots and logs/.
	OutDir string
	// Markdown is the BENCHMARKS.md to write; empty: none.
	Markdown string
	// Systems restricts the run to these spec names, "fairness",
	// "configs", "llm", "scale" and "capacity" selecting those
	// scenarios; empty: all (configs and scale only in a full run).
	Systems []string
	// Log receives progress lines.
	Log io.Writer
	// ScaleWaiters is the number of waiters of the scale scenario
	// ("scale"; a full run); zero: 50,000.
	ScaleWaiters int
	// ScaleRPS is their arrival rate, all client processes together;
	// zero: 700/s.
	ScaleRPS float64
	// Capacity names the capacity scenario's topologies ("one",
	// "pool") and workloads ("mixed", "chat") to run, from those of a
	// full run; a kind with no name named runs the mode's.
	Capacity []string
}

// Run runs the benchmark and writes its outputs. It returns an error only
// when it could not run (a binary or a server missing); targets missed
// are results, not errors.
func Run(ctx context.Context, opts Options) (*report.Results, error) {
	mode := "full"
	if opts.Quick {
		mode = "quick"
	}
	logDir := filepath.Join(opts.OutDir, "logs")
	if err := os.RemoveAll(logDir); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(logDir, 0o755); err != nil {
		return nil, err
	}
	haproxy, _ := exec.LookPath("haproxy")
	b := &scenario.Runner{
		Quick: opts.Quick, MockLLM: opts.MockLLM, Log: opts.Log,
		HC: &http.Client{Timeout: 10 * time.Second},
		Res: &report.Results{
			Mode: mode, Started: time.Now(), Settings: report.DefaultSettings(opts.Quick),
			Machine: report.DescribeMachine(opts.Caddy, haproxy),
		},
	}
	set := b.Res.Settings
	ps := procs.NewProcs(logDir)
	defer ps.StopAll()

	ports, err := procs.FreePorts(2)
	if err != nil {
		return nil, err
	}
	mockAddr := "127.0.0.1:" + strconv.Itoa(ports[0])
	redisAddr := "127.0.0.1:" + strconv.Itoa(ports[1])
	b.MockURL = "http://" + mockAddr
	b.Env = &systems.Env{
		Caddy: opts.Caddy, HAProxy: haproxy, Dir: logDir, Procs: ps,
		MockAddr: mockAddr, RedisAddr: redisAddr,
		Permits: set.Permits, MaxWait: report.Secs(set.MaxWaitS),
	}

	rs, err := ps.Start("redis", "redis-server", "--port", strconv.Itoa(ports[1]),
		"--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", logDir)
	if err != nil {
		return nil, fmt.Errorf("redis-server (run scripts/ensure-redis.sh): %w", err)
	}
	if err := rs.WaitListen(ctx, redisAddr, 15*time.Second); err != nil {
		return nil, err
	}
	b.RedisPID = rs.PID()
	mock, err := ps.Start("mockllm", opts.MockLLM, "-listen", mockAddr, "-timeline",
		"-tokens", "1", "-delay", report.MS(set.ServiceMS).String(), "-slots", strconv.Itoa(set.Permits))
	if err != nil {
		return nil, err
	}
	if err := mock.WaitListen(ctx, mockAddr, 15*time.Second); err != nil {
		return nil, err
	}
	b.RDB = redis.NewClient(&redis.Options{Addr: redisAddr, MaxRetries: -1, PoolSize: 2})
	defer b.RDB.Close()

	b.Logf("bench %s: %d CPUs (%s); permits %d, upstream %.0f ms, %d clients; logs in %s",
		mode, b.Res.Machine.CPUs, b.Res.Machine.CPU, set.Permits, set.ServiceMS, set.Clients, logDir)
	if haproxy == "" {
		b.Logf("haproxy not found: run scripts/ensure-haproxy.sh; HAProxy is left out")
	}
	if err := b.Calibrate(ctx); err != nil {
		return nil, err
	}
	for _, spec := range systems.DefaultSpecs() {
		if len(opts.Systems) > 0 && !slices.Contains(opts.Systems, spec.Name) {
			continue
		}
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		b.Res.Systems = append(b.Res.Systems, b.MeasureSystem(ctx, spec))
	}
	b.RunWaiters(ctx)
	if len(opts.Systems) == 0 || slices.Contains(opts.Systems, "fairness") {
		fairness.Run(ctx, b)
	}
	if (len(opts.Systems) == 0 && !opts.Quick) || slices.Contains(opts.Systems, "configs") {
		configs.Run(ctx, b)
	}
	if len(opts.Systems) == 0 || slices.Contains(opts.Systems, "llm") {
		llm.Run(ctx, b)
	}
	if (len(opts.Systems) == 0 && !opts.Quick) || slices.Contains(opts.Systems, "scale") {
		scale.Run(ctx, b, opts.ScaleWaiters, opts.ScaleRPS)
	}
	if len(opts.Systems) == 0 || slices.Contains(opts.Systems, "capacity") {
		capacity.Run(ctx, b, opts.Capacity)
	}
	if ctx.Err() != nil {
		return nil, ctx.Err()
	}

	b.Res.Machine.LoadEnd = report.LoadAverage()
	b.Res.Checks = report.Evaluate(b.Res)
	b.Res.Elapsed = report.Round(time.Since(b.Res.Started).Seconds(), 1)
	return b.Res, write(opts, b.Res)
}

// Render rewrites the plots and the Markdown report of opts from the
// results.json of an earlier run (in opts.OutDir), its targets evaluated
// again: for a report whose layout changed since the run.
func Render(opts Options) (*report.Results, error) {
	data, err := os.ReadFile(filepath.Join(opts.OutDir, "results.json"))
	if err != nil {
		return nil, err
	}
	res := new(report.Results)
	if err := json.Unmarshal(data, res); err != nil {
		return nil, fmt.Errorf("results.json: %w", err)
	}
	res.Checks = report.Evaluate(res)
	return res, write(opts, res)
}

// write saves results.json, the plots and BENCHMARKS.md.
func write(opts Options, res *report.Results) error {
	data, err := json.MarshalIndent(res, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(opts.OutDir, "results.json"), append(data, '\n'), 0o644); err != nil {
		return err
	}
	plots, err := report.WritePlots(res, opts.OutDir)
	if err != nil {
		logf(opts, "plots: %v", err)
	}
	if opts.Markdown == "" {
		return nil
	}
	return os.WriteFile(opts.Markdown, []byte(report.Markdown(res, report.Files{OutDir: opts.OutDir, Markdown: opts.Markdown}, plots)), 0o644)
}

// logf writes one progress line to opts.Log.
func logf(opts Options, format string, args ...any) {
	if opts.Log != nil {
		fmt.Fprintf(opts.Log, format+"\n", args...)
	}
}
