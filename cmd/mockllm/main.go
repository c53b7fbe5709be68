// Command mockllm runs the mock OpenAI-compatible upstream of package
// internal/mockllm, for demos and manual tests of the fair queue.
//
// Usage:
//
//	mockllm [-listen 127.0.0.1:8081] [-tokens 8] [-delay 20ms] [-timeline]
//	        [-kv-tokens N [-max-num-seqs 256] [-max-batched-tokens 8192]
//	         [-step-base 8ms] [-step-per-seq 100us] [-prefill-per-token 50us]
//	         [-answer-median 128] [-answer-sigma 0.8] [-max-answer 4096] [-seed 0]]
//
// Requests may override the answer with the X-Mock-Tokens and
// X-Mock-Delay headers; GET /stats shows the concurrency it saw, and with
// -timeline the busy time and handoff gaps that the bench (bench/) reads.
//
// -kv-tokens N answers from a model of a GPU server instead (vLLM's
// scheduler, mockllm.GPUConfig): every request runs in one batch whose
// step lasts -step-base + -step-per-seq x the sequences in it +
// -prefill-per-token x the tokens it computes beyond one per sequence;
// each running request holds its prompt and the tokens it made in a KV
// cache of N tokens, and when a step would overflow it the newest running
// request is preempted (its tokens freed, recomputed when it runs again);
// beyond -max-num-seqs requests wait inside the server. A prompt counts
// its text's bytes / 4 tokens (the messages' content, or the prompt); the
// answer is X-Mock-Tokens, max_completion_tokens or max_tokens long, else
// drawn from a log-normal (-answer-median, -answer-sigma, at most
// -max-answer) seeded by -seed. Tokens stream as the steps make them,
// and every answer ends with its usage. GET /metrics shows the model
// under vLLM's names: vllm:num_requests_running, vllm:num_requests_waiting,
// vllm:kv_cache_usage_perc (0-1), vllm:num_preemptions_total, the
// vllm:time_to_first_token_seconds histogram, token and request counters,
// and vllm:cache_config_info (num_gpu_blocks: the cache in tokens); GET
// /stats adds a "gpu" object (KV tokens held and their peak, running,
// waiting, preemptions since the last reset).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"go.uber.org/zap"

	"github.com/fair-queue/caddy-fair-queue/internal/mockllm"
)

func main() {
	listen := flag.String("listen", "127.0.0.1:8081", "address to listen on")
	tokens := flag.Int("tokens", mockllm.DefaultTokens, "tokens per answer")
	delay := flag.Duration("delay", mockllm.DefaultDelay, "delay before each token")
	timeline := flag.Bool("timeline", false, "report busy_ms and handoff_gaps_us in /stats (benchmarks)")
	refuse := flag.Int("refuse", 0, "answer the first n completion requests with -refuse-status (an overloaded server)")
	refuseStatus := flag.Int("refuse-status", 503, "status of a refused request")
	retryAfter := flag.String("retry-after", "1", "Retry-After of a refused request (\"\": none)")
	slots := flag.Int("slots", 0, "answer at most this many of the completion requests that carry X-Mock-Queue at once; the others wait in arrival order (0: none wait)")
	var gpu mockllm.GPUConfig
	flag.IntVar(&gpu.KVTokens, "kv-tokens", 0, "GPU model: the KV cache's size in tokens (0: no GPU model, answers take -delay per token)")
	flag.IntVar(&gpu.MaxNumSeqs, "max-num-seqs", mockllm.DefaultMaxNumSeqs, "GPU model: most requests running at once; the others wait in the server")
	flag.IntVar(&gpu.MaxBatchedTokens, "max-batched-tokens", mockllm.DefaultMaxBatchedTokens, "GPU model: most tokens a step computes (longer prompts in chunks)")
	flag.DurationVar(&gpu.StepBase, "step-base", mockllm.DefaultStepBase, "GPU model: a step's fixed time")
	flag.DurationVar(&gpu.StepPerSeq, "step-per-seq", mockllm.DefaultStepPerSeq, "GPU model: a step's time per request in it")
	flag.DurationVar(&gpu.PrefillPerToken, "prefill-per-token", mockllm.DefaultPrefillPerToken, "GPU model: a step's time per token computed beyond one per request (prompts)")
	flag.IntVar(&gpu.AnswerMedian, "answer-median", mockllm.DefaultAnswerMedian, "GPU model: median tokens of an answer whose request names no length")
	flag.Float64Var(&gpu.AnswerSigma, "answer-sigma", mockllm.DefaultAnswerSigma, "GPU model: sigma of the log of those lengths")
	flag.IntVar(&gpu.MaxAnswer, "max-answer", mockllm.DefaultMaxAnswer, "GPU model: the longest answer drawn")
	flag.Uint64Var(&gpu.Seed, "seed", 0, "GPU model: seed of the answer lengths drawn")
	flag.Parse()
	if gpu.KVTokens > 0 {
		if err := gpu.Check(); err != nil {
			fmt.Fprintln(os.Stderr, "mockllm:", err)
			os.Exit(2)
		}
	}

	logger, err := zap.NewDevelopment()
	if err != nil {
		panic(err)
	}
	defer func() { _ = logger.Sync() }()

	if err := run(logger, *listen, mockllm.Config{Tokens: *tokens, Delay: *delay, Timeline: *timeline,
		Refuse: *refuse, RefuseStatus: *refuseStatus, RetryAfter: *retryAfter, Slots: *slots, GPU: gpu}); err != nil {
		logger.Error("mockllm failed", zap.Error(err))
		os.Exit(1)
	}
}

// run serves until SIGINT or SIGTERM, then lets running answers finish
// for up to 5s and cuts the rest.
func run(logger *zap.Logger, listen string, cfg mockllm.Config) error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	ln, err := net.Listen("tcp", listen)
	if err != nil {
		return fmt.Errorf("listen: %w", err)
	}
	mock := mockllm.New(cfg)
	defer mock.Close()
	srv := &http.Server{
		Handler:           mock.Handler(),
		ReadHeaderTimeout: 10 * time.Second,
	}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	logger.Info("mockllm listening",
		zap.String("addr", ln.Addr().String()),
		zap.Int("tokens", cfg.Tokens),
		zap.Duration("delay", cfg.Delay),
		zap.Int("kv_tokens", cfg.GPU.KVTokens))

	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	logger.Info("mockllm shutting down")
	shutdownCtx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := srv.Shutdown(shutdownCtx); err != nil {
		logger.Warn("cutting answers still running", zap.Error(err))
		_ = srv.Close()
	}
	if err := <-errc; !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}
