// Command mockllm runs the mock OpenAI-compatible upstream of package
// internal/mockllm, for demos and manual tests of the fair queue.
//
// Usage:
//
//	mockllm [-listen 127.0.0.1:8081] [-tokens 8] [-delay 20ms] [-timeline]
//
// Requests may override the answer with the X-Mock-Tokens and
// X-Mock-Delay headers; GET /stats shows the concurrency it saw, and with
// -timeline the busy time and handoff gaps that the bench (bench/) reads.
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
	flag.Parse()

	logger, err := zap.NewDevelopment()
	if err != nil {
		panic(err)
	}
	defer func() { _ = logger.Sync() }()

	if err := run(logger, *listen, mockllm.Config{Tokens: *tokens, Delay: *delay, Timeline: *timeline,
		Refuse: *refuse, RefuseStatus: *refuseStatus, RetryAfter: *retryAfter, Slots: *slots}); err != nil {
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
	srv := &http.Server{
		Handler:           mockllm.New(cfg).Handler(),
		ReadHeaderTimeout: 10 * time.Second,
	}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	logger.Info("mockllm listening",
		zap.String("addr", ln.Addr().String()),
		zap.Int("tokens", cfg.Tokens),
		zap.Duration("delay", cfg.Delay))

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
