// Command bench compares fair_queue with HAProxy and plain Caddy
// reverse_proxy in front of the same mock LLM (package internal/bench)
// and writes BENCHMARKS.md, bench-results/results.json and PNG plots.
// It is a module of its own (see go.mod); build it from this directory:
// go build -o ../bin/bench . (make bench-bins).
//
// Usage:
//
//	bench [-quick] [-caddy bin/caddy] [-mockllm bin/mockllm] [-out bench-results]
//	      [-md BENCHMARKS.md] [-systems haproxy,caddy,caddy-3,fq-local,fq-redis-1,fq-redis-3,fairness,configs,llm,scale,capacity]
//	      [-scale-waiters 50000] [-scale-rps 700] [-capacity one,pool,mixed,chat]
//	bench -render [-out bench-results] [-md BENCHMARKS.md]
//
// It needs redis-server in PATH and, for the reference, haproxy
// (scripts/ensure-redis.sh, scripts/ensure-haproxy.sh). Missed targets
// are reported, not failures: it exits non-zero only when it cannot run.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/fair-queue/caddy-fair-queue/bench/internal/bench"
	"github.com/fair-queue/caddy-fair-queue/bench/internal/scenario/scale"
)

func main() {
	var opts bench.Options
	flag.BoolVar(&opts.Quick, "quick", false, "short run (about 4 minutes) for regressions")
	flag.StringVar(&opts.Caddy, "caddy", "bin/caddy", "Caddy binary with the fair_queue plugin")
	flag.StringVar(&opts.MockLLM, "mockllm", "bin/mockllm", "mockllm binary")
	flag.StringVar(&opts.OutDir, "out", "bench-results", "directory for results.json, plots and logs")
	flag.StringVar(&opts.Markdown, "md", "BENCHMARKS.md", "markdown report to write (empty: none)")
	systems := flag.String("systems", "", "comma-separated subset of systems to run, \"fairness\" for the fairness scenario, \"configs\" for the bench's JSON vs a Caddyfile alternated, \"llm\" for the LLM-shaped load, \"scale\" for 50,000 waiters and 100 queues, \"capacity\" for fixed permits in front of a GPU-shaped backend (default all; configs and scale only in a full run)")
	limit := flag.Duration("limit", 0, "abort after this long (default 8m quick, 75m full)")
	render := flag.Bool("render", false, "run nothing: rewrite the report and plots from <out>/results.json")
	flag.IntVar(&opts.ScaleWaiters, "scale-waiters", 0, "waiters of the scale scenario (default 50000)")
	flag.Float64Var(&opts.ScaleRPS, "scale-rps", 0, "arrival rate of the scale scenario's waiters, per second (default 700)")
	capacity := flag.String("capacity", "", "the capacity scenario's topologies (one, pool), workloads (mixed, chat) and rows (alone, haproxy-16, fq-<permits>, fq-kv, fq-adaptive, fq-kv-learned, fq-kv-1024) to run, comma-separated (default: the mode's; a quick run: one and pool, mixed)")
	scaleClient := flag.String("scale-client", "", "internal: run one client process of the scale scenario from this loadgen config (JSON)")
	flag.Parse()
	// 50,000 waiters need every descriptor the hard limit allows, in the
	// bench and in the processes it starts (they inherit it).
	if _, err := scale.RaiseFileLimit(); err != nil {
		fmt.Fprintln(os.Stderr, "bench: raise the open-file limit:", err)
	}
	if *scaleClient != "" {
		ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
		defer stop()
		if err := scale.RunClient(ctx, *scaleClient, os.Stdout); err != nil {
			fmt.Fprintln(os.Stderr, "bench client:", err)
			os.Exit(1)
		}
		return
	}
	if *render {
		res, err := bench.Render(opts)
		if err != nil {
			fmt.Fprintln(os.Stderr, "bench:", err)
			os.Exit(1)
		}
		fmt.Printf("bench: rendered the %s run of %s\n", res.Mode, res.Started.Format(time.RFC3339))
		return
	}

	if *systems != "" {
		opts.Systems = strings.Split(*systems, ",")
	}
	if *capacity != "" {
		opts.Capacity = strings.Split(*capacity, ",")
	}
	for _, bin := range []string{opts.Caddy, opts.MockLLM} {
		if _, err := os.Stat(bin); err != nil {
			fmt.Fprintf(os.Stderr, "bench: %v (build it: make caddy; go build -o bin/mockllm ./cmd/mockllm)\n", err)
			os.Exit(2)
		}
	}
	if *limit == 0 {
		*limit = 75 * time.Minute
		if opts.Quick {
			*limit = 8 * time.Minute
		}
	}
	opts.Log = os.Stdout

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	ctx, cancel := context.WithTimeout(ctx, *limit)
	defer cancel()

	res, err := bench.Run(ctx, opts)
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
	fmt.Printf("\n%-52s %-12s %-8s %s\n", "target", "system", "result", "measured")
	for _, c := range res.Checks {
		fmt.Printf("%-52s %-12s %-8s %s\n", c.Target, c.System, c.Result, c.Value)
	}
	fmt.Printf("\nbench: %s run in %.0f s; wrote %s/results.json", res.Mode, res.Elapsed, opts.OutDir)
	if opts.Markdown != "" {
		fmt.Printf(" and %s", opts.Markdown)
	}
	fmt.Println()
}
