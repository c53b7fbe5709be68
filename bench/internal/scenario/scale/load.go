package scale

// The scale scenario's nodes and loads: starting them, the loadgen
// configs, the mock's counters.

import (
	"context"
	"slices"
	"time"

	"github.com/fair-queue/caddy-fair-queue/bench/internal/report"
	"github.com/fair-queue/caddy-fair-queue/bench/internal/scenario"
	"github.com/fair-queue/caddy-fair-queue/internal/loadgen"
)

// holdConfig takes n permits with streams that last minutes; waitConfig
// queues n streams arriving at rate per second (each a 10 ms answer once
// served).
func holdConfig(targets []string, n int, header map[string]string) loadgen.Config {
	cfg := loadgen.Config{
		Targets: targets, PromptBytes: 16, Clients: n, Requests: n, MaxInFlight: n,
		Stream: true, Tokens: 1, Delay: 10 * time.Minute, Timeout: 30 * time.Minute,
	}
	setHeader(&cfg, header)
	return cfg
}

func waitConfig(targets []string, n, promptBytes int, rate float64, header map[string]string) loadgen.Config {
	cfg := loadgen.Config{
		Targets: targets, PromptBytes: promptBytes, MaxInFlight: n + 16,
		Rate: rate, Duration: time.Duration((float64(n) - 0.5) / rate * float64(time.Second)),
		Stream: true, Tokens: 1, Delay: 10 * time.Millisecond, Timeout: 30 * time.Minute,
	}
	setHeader(&cfg, header)
	return cfg
}

func setHeader(cfg *loadgen.Config, header map[string]string) {
	for k, v := range header {
		if cfg.Header == nil {
			cfg.Header = map[string][]string{}
		}
		cfg.Header.Set(k, v)
	}
}

// handoffs reads mockllm's handoff gaps since its last reset.
func handoffs(ctx context.Context, b *scenario.Runner) (*report.Handoffs, int, error) {
	st, err := b.MockStats(ctx)
	if err != nil {
		return nil, 0, err
	}
	gaps := make([]time.Duration, len(st.HandoffGapsUS))
	for i, us := range st.HandoffGapsUS {
		gaps[i] = time.Duration(us) * time.Microsecond
	}
	slices.Sort(gaps)
	return &report.Handoffs{Count: len(gaps), P50: report.MSOf(loadgen.Percentile(gaps, 50)), P90: report.MSOf(loadgen.Percentile(gaps, 90)),
			P99: report.MSOf(loadgen.Percentile(gaps, 99)), Max: report.MSOf(loadgen.Percentile(gaps, 100))},
		st.MaxInFlight, nil
}
