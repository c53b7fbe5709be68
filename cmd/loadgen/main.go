// Command loadgen sends OpenAI-style chat completion requests to one or
// more targets and reports what they saw: counts by status and reject
// reason, time to first byte and total latency per target, throughput.
//
// Usage:
//
//	loadgen -targets http://127.0.0.1:8080[,http://...] (-c 64 [-n 1000 | -d 10s] | -rate 300 -d 10s)
//	        [-stream] [-tokens 8] [-delay 20ms] [-prompt-bytes 16] [-timeout 60s]
//	        [-progress] [-redis 127.0.0.1:6379 -queue default]
//	        [-upstream-stats http://127.0.0.1:8081/stats[,http://...] [-permits 4[,2,...]]]
//	        [-wait-table] [-json out.json] [-results]
//
// Closed loop: -c clients, each sending its next request when the last
// one ends, for -n requests in total or for -d (with neither, each client
// sends one request). Open loop: -rate requests
// per second for -d. -tokens and -delay go to the upstream as the
// X-Mock-Tokens and X-Mock-Delay headers of internal/mockllm.
//
// -upstream-stats is the mockllm GET /stats URL of the upstream, or a
// comma-separated list of them for the replicas of a fair_queue upstream
// pool; -permits then lists as many permit counts, the i-th for the i-th
// replica (0: not checked). The progress line shows the upstream's
// requests in flight and highest concurrency, for several replicas each
// one's over its permits: "| replicas 1/1 2/2 3/3 (max 1 2 3)". The
// summary compares each replica's highest concurrency with its permits
// and exits 1 if any ran more requests at once than its permits.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/fair-queue/caddy-fair-queue/internal/loadgen"
)

func main() {
	os.Exit(run())
}

func run() int {
	var (
		cfg       loadgen.Config
		targets   = flag.String("targets", "http://127.0.0.1:8080", "comma-separated base URLs, used round-robin")
		progress  = flag.Bool("progress", false, "print a progress line every -every")
		every     = flag.Duration("every", 500*time.Millisecond, "progress interval")
		redisAddr = flag.String("redis", "", "Redis address (host:port) of the queue, for the queue depth in the progress line")
		queue     = flag.String("queue", "default", "fair_queue name, with -redis")
		prefix    = flag.String("key-prefix", "fair_queue", "fair_queue Redis key prefix, with -redis")
		upstream  = flag.String("upstream-stats", "", "mockllm /stats URL, for the upstream's concurrency; comma-separated for the replicas of a pool")
		permits   = flag.String("permits", "", "with -upstream-stats: check that each upstream never ran more than this many requests at once; comma-separated, one per -upstream-stats URL (0: not checked)")
		jsonOut   = flag.String("json", "", "write the report as JSON to this file")
		results   = flag.Bool("results", false, "with -json: include every request's result")
		headers   = flag.String("H", "", "extra request headers, 'Name: value' separated by ';'")
		waitTable = flag.Bool("wait-table", false, "end with a per-target table of the wait for a permit (time to first byte)")
	)
	flag.IntVar(&cfg.Clients, "c", 0, "closed loop: number of concurrent clients")
	flag.IntVar(&cfg.Requests, "n", 0, "closed loop: total number of requests")
	flag.DurationVar(&cfg.Duration, "d", 0, "send requests for this long")
	flag.Float64Var(&cfg.Rate, "rate", 0, "open loop: arrivals per second (needs -d)")
	flag.IntVar(&cfg.MaxInFlight, "max-in-flight", loadgen.DefaultMaxInFlight, "open loop: most requests running at once")
	flag.BoolVar(&cfg.Stream, "stream", false, `ask for streamed answers ("stream": true)`)
	flag.IntVar(&cfg.Tokens, "tokens", -1, "X-Mock-Tokens header (negative: not sent)")
	flag.DurationVar(&cfg.Delay, "delay", -1, "X-Mock-Delay header (negative: not sent)")
	flag.IntVar(&cfg.PromptBytes, "prompt-bytes", loadgen.DefaultPromptBytes, "size of the user message")
	flag.StringVar(&cfg.Model, "model", loadgen.DefaultModel, "model name")
	flag.StringVar(&cfg.Path, "path", loadgen.DefaultPath, "request path")
	flag.DurationVar(&cfg.Timeout, "timeout", loadgen.DefaultTimeout, "per-request timeout")
	flag.Parse()

	cfg.Targets = strings.Split(*targets, ",")
	replicas, err := loadgen.ParseReplicas(*upstream, *permits)
	if err != nil {
		fmt.Fprintln(os.Stderr, "loadgen:", err)
		return 2
	}
	cfg.KeepResults = *results
	if *headers != "" {
		cfg.Header = http.Header{}
		for h := range strings.SplitSeq(*headers, ";") {
			name, value, ok := strings.Cut(h, ":")
			if !ok {
				fmt.Fprintf(os.Stderr, "loadgen: bad header %q, want 'Name: value'\n", h)
				return 2
			}
			cfg.Header.Add(strings.TrimSpace(name), strings.TrimSpace(value))
		}
	}
	if cfg.Clients == 0 && cfg.Rate == 0 {
		cfg.Clients = 1
	}
	if cfg.Clients > 0 && cfg.Requests == 0 && cfg.Duration == 0 {
		cfg.Requests = cfg.Clients
	}

	r, err := loadgen.New(cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, "loadgen:", err)
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	var mon *loadgen.Monitor
	if *progress {
		st, _ := os.Stdout.Stat()
		mon = loadgen.StartProgress(r, os.Stdout, loadgen.ProgressConfig{
			Every: *every, RedisAddr: *redisAddr, Queue: *queue, KeyPrefix: *prefix,
			Replicas:  replicas,
			Overwrite: st != nil && st.Mode()&os.ModeCharDevice != 0,
		})
	}
	rep, err := r.Run(ctx)
	var obs loadgen.Observed
	if mon != nil {
		obs = mon.Stop()
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "loadgen:", err)
		return 1
	}
	code := 0
	if len(replicas) > 0 {
		// The final read: the monitor's last one stands in for a replica
		// that does not answer.
		if len(obs.Replicas) != len(replicas) {
			obs.Replicas = make([]loadgen.UpstreamStats, len(replicas))
		}
		sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		stats, errs := loadgen.FetchReplicaStats(sctx, http.DefaultClient, replicas)
		cancel()
		for i, err := range errs {
			if err != nil {
				fmt.Fprintf(os.Stderr, "loadgen: upstream stats %s: %v\n", replicas[i].Stats, err)
			} else {
				obs.Replicas[i] = stats[i]
			}
		}
		if len(replicas) == 1 {
			if errs[0] == nil {
				rep.Upstream = map[string]any{"max_in_flight": stats[0].MaxInFlight, "served": stats[0].Served, "canceled": stats[0].Canceled}
			}
		} else {
			var list []map[string]any
			for i, r := range replicas {
				list = append(list, map[string]any{"stats": r.Stats, "permits": r.Permits,
					"max_in_flight": obs.Replicas[i].MaxInFlight, "served": obs.Replicas[i].Served, "canceled": obs.Replicas[i].Canceled})
			}
			rep.Upstream = map[string]any{"replicas": list}
		}
	}
	fmt.Println()
	if err := rep.WriteText(os.Stdout); err != nil {
		return 1
	}
	if *waitTable {
		fmt.Println()
		if err := rep.WriteWaitTable(os.Stdout); err != nil {
			return 1
		}
	}
	if *redisAddr != "" && *progress {
		fmt.Printf("queue: deepest %d waiting, most permits held %d\n", obs.MaxWaiting, obs.MaxHolders)
	}
	if len(replicas) > 0 && loadgen.WriteReplicaSummary(os.Stdout, replicas, obs.Replicas) {
		code = 1
	}
	if *jsonOut != "" {
		if err := writeJSON(*jsonOut, rep); err != nil {
			fmt.Fprintln(os.Stderr, "loadgen:", err)
			return 1
		}
	}
	return code
}

func writeJSON(path string, v any) error {
	data, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(data, '\n'), 0o644)
}
