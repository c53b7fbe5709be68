// Package bench measures fair_queue side by side with HAProxy and plain
// Caddy reverse_proxy on one machine: it starts mockllm, redis-server,
// HAProxy and Caddy processes on free loopback ports, drives them with
// package loadgen, and writes results.json, PNG plots and BENCHMARKS.md.
// The bench command (bench/main.go) is its command line (make bench,
// make bench-quick).
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

// bench is one run in progress.
type bench struct {
	opts    Options
	env     *systems.Env
	rdb     *redis.Client
	hc      *http.Client
	mockURL string
	res     *report.Results
	// redisPID is redis-server's process id, whose CPU time the Redis
	// systems' loads read.
	redisPID int
}

func (b *bench) logf(format string, args ...any) {
	if b.opts.Log != nil {
		fmt.Fprintf(b.opts.Log, format+"\n", args...)
	}
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
	b := &bench{
		opts: opts,
		hc:   &http.Client{Timeout: 10 * time.Second},
		res: &report.Results{
			Mode: mode, Started: time.Now(), Settings: report.DefaultSettings(opts.Quick),
			Machine: report.DescribeMachine(opts.Caddy, haproxy),
		},
	}
	set := b.res.Settings
	ps := procs.NewProcs(logDir)
	defer ps.StopAll()

	ports, err := procs.FreePorts(2)
	if err != nil {
		return nil, err
	}
	mockAddr := "127.0.0.1:" + strconv.Itoa(ports[0])
	redisAddr := "127.0.0.1:" + strconv.Itoa(ports[1])
	b.mockURL = "http://" + mockAddr
	b.env = &systems.Env{
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
	b.redisPID = rs.PID()
	mock, err := ps.Start("mockllm", opts.MockLLM, "-listen", mockAddr, "-timeline",
		"-tokens", "1", "-delay", report.MS(set.ServiceMS).String(), "-slots", strconv.Itoa(set.Permits))
	if err != nil {
		return nil, err
	}
	if err := mock.WaitListen(ctx, mockAddr, 15*time.Second); err != nil {
		return nil, err
	}
	b.rdb = redis.NewClient(&redis.Options{Addr: redisAddr, MaxRetries: -1, PoolSize: 2})
	defer b.rdb.Close()

	b.logf("bench %s: %d CPUs (%s); permits %d, upstream %.0f ms, %d clients; logs in %s",
		mode, b.res.Machine.CPUs, b.res.Machine.CPU, set.Permits, set.ServiceMS, set.Clients, logDir)
	if haproxy == "" {
		b.logf("haproxy not found: run scripts/ensure-haproxy.sh; HAProxy is left out")
	}
	if err := b.calibrate(ctx); err != nil {
		return nil, err
	}
	for _, spec := range systems.DefaultSpecs() {
		if len(opts.Systems) > 0 && !slices.Contains(opts.Systems, spec.Name) {
			continue
		}
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		b.res.Systems = append(b.res.Systems, b.measureSystem(ctx, spec))
	}
	b.runWaiters(ctx)
	if len(opts.Systems) == 0 || slices.Contains(opts.Systems, "fairness") {
		b.runFairness(ctx)
	}
	if (len(opts.Systems) == 0 && !opts.Quick) || slices.Contains(opts.Systems, "configs") {
		b.runConfigs(ctx)
	}
	if len(opts.Systems) == 0 || slices.Contains(opts.Systems, "llm") {
		b.runLLM(ctx)
	}
	if (len(opts.Systems) == 0 && !opts.Quick) || slices.Contains(opts.Systems, "scale") {
		b.runScale(ctx)
	}
	if len(opts.Systems) == 0 || slices.Contains(opts.Systems, "capacity") {
		b.runCapacity(ctx)
	}
	if ctx.Err() != nil {
		return nil, ctx.Err()
	}

	b.res.Machine.LoadEnd = report.LoadAverage()
	b.res.Checks = report.Evaluate(b.res)
	b.res.Elapsed = report.Round(time.Since(b.res.Started).Seconds(), 1)
	return b.res, b.write()
}

// openLoopFor says which systems get the arrival-rate sweep: the limiters
// (a quick run leaves out the 3-node cluster to stay short).
func (b *bench) openLoopFor(spec systems.Spec) bool {
	if !spec.Limited() {
		return false
	}
	return !b.opts.Quick || spec.Nodes == 1
}

// runWaiters measures the systems holding many waiters: the Redis store
// on one node (RSS with 1 KiB and 64 KiB prompts, idle Redis load), and
// in a full run the local store too.
func (b *bench) runWaiters(ctx context.Context) {
	set := b.res.Settings
	for _, spec := range systems.DefaultSpecs() {
		if spec.Kind != systems.KindFairQueue || spec.Nodes != 1 || (!spec.Redis && b.opts.Quick) {
			continue
		}
		if b.res.System(spec.Name) == nil {
			continue // did not run, or failed
		}
		b.logf("== %s: %d waiters", spec.Label, set.Waiters)
		type waiterLoad struct {
			prompt      int
			rate        float64
			idle, burst bool
		}
		loads := []waiterLoad{
			{prompt: 1 << 10, idle: true},
			{prompt: 64 << 10},
		}
		for _, burst := range set.Bursts {
			if spec.Redis {
				loads = append(loads, waiterLoad{prompt: burst.PromptBytes, rate: burst.RPS, burst: true})
			}
		}
		for _, l := range loads {
			if ctx.Err() != nil {
				return
			}
			if l.rate == 0 {
				l.rate = min(set.WaiterRampRPS, set.WaiterRampMiBps*(1<<20)/float64(l.prompt))
			}
			run, err := b.waiters(ctx, spec, set.Waiters, l.prompt, l.rate, l.idle)
			if err != nil {
				b.logf("   failed: %v", err)
				run = &report.WaiterRun{System: spec.Name, Waiters: set.Waiters, PromptBytes: l.prompt, RampRPS: l.rate, Note: err.Error()}
			}
			run.Burst = l.burst
			b.res.Waiters = append(b.res.Waiters, run)
		}
	}
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
	b := &bench{opts: opts, res: res}
	return res, b.write()
}

// write saves results.json, the plots and BENCHMARKS.md.
func (b *bench) write() error {
	data, err := json.MarshalIndent(b.res, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(b.opts.OutDir, "results.json"), append(data, '\n'), 0o644); err != nil {
		return err
	}
	plots, err := report.WritePlots(b.res, b.opts.OutDir)
	if err != nil {
		b.logf("plots: %v", err)
	}
	if b.opts.Markdown == "" {
		return nil
	}
	return os.WriteFile(b.opts.Markdown, []byte(report.Markdown(b.res, report.Files{OutDir: b.opts.OutDir, Markdown: b.opts.Markdown}, plots)), 0o644)
}
