// Package scenario runs the bench's measurements on the processes of a
// run. Runner is what every scenario measures with: closed and open
// loads, the upstream's and Redis's counters, CPU samples. This package
// holds the comparison of the systems under test (low load, saturated
// loads, the open-loop sweep) and the many-waiters runs; the other
// scenarios are its subpackages (fairness, configs, llm, scale,
// capacity), each filling its part of the results (package report).
// Package bench starts the processes and ties the scenarios together.
package scenario

import (
	"context"
	"fmt"
	"io"
	"net/http"

	"github.com/fair-queue/caddy-fair-queue/bench/internal/report"
	"github.com/fair-queue/caddy-fair-queue/bench/internal/systems"
	"github.com/redis/go-redis/v9"
)

// Runner is one run in progress: what every scenario measures with.
type Runner struct {
	// Quick selects the short version of each scenario.
	Quick bool
	// MockLLM is the path of the mockllm binary (the capacity
	// scenario's replicas).
	MockLLM string
	// Log receives progress lines; nil: none.
	Log io.Writer
	// Env starts the systems under test; RDB is a client of its Redis.
	Env *systems.Env
	RDB *redis.Client
	// HC is the client of the bench's own calls (the upstream's /stats
	// and /reset); MockURL is the shared upstream's base URL.
	HC      *http.Client
	MockURL string
	// Res receives the measurements.
	Res *report.Results
	// RedisPID is redis-server's process id, whose CPU time the Redis
	// systems' loads read.
	RedisPID int
}

// Logf writes one progress line.
func (b *Runner) Logf(format string, args ...any) {
	if b.Log != nil {
		fmt.Fprintf(b.Log, format+"\n", args...)
	}
}

// openLoopFor says which systems get the arrival-rate sweep: the limiters
// (a quick run leaves out the 3-node cluster to stay short).
func (b *Runner) openLoopFor(spec systems.Spec) bool {
	if !spec.Limited() {
		return false
	}
	return !b.Quick || spec.Nodes == 1
}

// RunWaiters measures the systems holding many waiters: the Redis store
// on one node (RSS with 1 KiB and 64 KiB prompts, idle Redis load), and
// in a full run the local store too.
func (b *Runner) RunWaiters(ctx context.Context) {
	set := b.Res.Settings
	for _, spec := range systems.DefaultSpecs() {
		if spec.Kind != systems.KindFairQueue || spec.Nodes != 1 || (!spec.Redis && b.Quick) {
			continue
		}
		if b.Res.System(spec.Name) == nil {
			continue // did not run, or failed
		}
		b.Logf("== %s: %d waiters", spec.Label, set.Waiters)
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
				b.Logf("   failed: %v", err)
				run = &report.WaiterRun{System: spec.Name, Waiters: set.Waiters, PromptBytes: l.prompt, RampRPS: l.rate, Note: err.Error()}
			}
			run.Burst = l.burst
			b.Res.Waiters = append(b.Res.Waiters, run)
		}
	}
}
