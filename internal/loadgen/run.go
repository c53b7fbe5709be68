package loadgen

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Counters are the live totals of a run. They are safe to read while the
// run goes on (the progress line reads them).
type Counters struct {
	// Sent counts requests sent.
	Sent atomic.Int64
	// Granted counts responses whose headers came back with status 200:
	// for a streaming request behind a queue, the moment it got its
	// permit.
	Granted atomic.Int64
	// OK counts requests answered in full.
	OK atomic.Int64
	// Rejected counts rejects: a Fair-Queue-Reason header, an SSE error
	// event, or status 429 or 503.
	Rejected atomic.Int64
	// Failed counts transport errors, timeouts and other statuses.
	Failed atomic.Int64
	// Canceled counts requests cut short because the run was canceled.
	Canceled atomic.Int64
	// Dropped counts open-loop arrivals not sent because MaxInFlight
	// requests were running.
	Dropped atomic.Int64
	// InFlight is the number of requests running now.
	InFlight atomic.Int64
}

// Runner runs one load described by a Config. Make one with New.
type Runner struct {
	cfg    Config
	client *http.Client
	body   []byte
	live   Counters
	rr     atomic.Uint64

	mu      sync.Mutex
	results []Result
	start   time.Time
}

// New checks cfg, fills in its defaults and returns a Runner for it.
func New(cfg Config) (*Runner, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, fmt.Errorf("loadgen config: %w", err)
	}
	conns := max(cfg.Clients, 64)
	if cfg.Rate > 0 {
		conns = max(conns, min(cfg.MaxInFlight, int(cfg.Rate)*4))
	}
	tr := &http.Transport{
		Proxy:               nil, // loopback benchmarks: never an HTTP proxy from the environment
		DialContext:         (&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		MaxIdleConns:        conns,
		MaxIdleConnsPerHost: conns,
		IdleConnTimeout:     90 * time.Second,
		DisableCompression:  true,
		ForceAttemptHTTP2:   false,
	}
	return &Runner{
		cfg:    cfg,
		client: &http.Client{Transport: tr},
		body:   requestBody(cfg.Model, cfg.Stream, cfg.PromptBytes),
	}, nil
}

// Config returns the run's configuration, defaults filled in.
func (r *Runner) Config() Config { return r.cfg }

// Counters returns the live totals of the run.
func (r *Runner) Counters() *Counters { return &r.live }

// Elapsed returns the time since the run started, zero before.
func (r *Runner) Elapsed() time.Duration {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.start.IsZero() {
		return 0
	}
	return time.Since(r.start)
}

// Run sends the load and returns its report once every request sent has
// ended. Canceling ctx stops sending and cuts the running requests short
// (they count as canceled). A Runner runs once.
func (r *Runner) Run(ctx context.Context) (*Report, error) {
	r.mu.Lock()
	if !r.start.IsZero() {
		r.mu.Unlock()
		return nil, fmt.Errorf("loadgen: a runner runs once")
	}
	r.start = time.Now()
	r.mu.Unlock()
	defer r.client.CloseIdleConnections()

	switch {
	case len(r.cfg.Schedule) > 0:
		r.scheduled(ctx)
	case r.cfg.Open():
		r.openLoop(ctx)
	default:
		r.closedLoop(ctx)
	}
	elapsed := time.Since(r.start)
	r.mu.Lock()
	results := r.results
	r.mu.Unlock()
	return newReport(r.cfg, r.start, elapsed, results, r.live.Dropped.Load()), nil
}

// closedLoop runs Clients clients, each sending its next request when the
// previous one ends, until Requests were sent or Duration passed.
func (r *Runner) closedLoop(ctx context.Context) {
	var deadline time.Time
	if r.cfg.Duration > 0 {
		deadline = r.start.Add(r.cfg.Duration)
	}
	var issued atomic.Int64
	var wg sync.WaitGroup
	for range r.cfg.Clients {
		wg.Go(func() {
			for ctx.Err() == nil {
				if r.cfg.Requests > 0 && issued.Add(1) > int64(r.cfg.Requests) {
					return
				}
				if !deadline.IsZero() && !time.Now().Before(deadline) {
					return
				}
				r.one(ctx, -1)
			}
		})
	}
	wg.Wait()
}

// openLoop sends requests at evenly spaced arrival times for Duration,
// whether or not earlier ones have ended.
func (r *Runner) openLoop(ctx context.Context) {
	r.arrivals(ctx, func(i int) (time.Duration, int, bool) {
		at := time.Duration(float64(i) * float64(time.Second) / r.cfg.Rate)
		return at, -1, at < r.cfg.Duration
	})
}

// scheduled sends one request per arrival of the schedule at its time
// (up to Duration when set), whether or not earlier ones have ended.
func (r *Runner) scheduled(ctx context.Context) {
	r.arrivals(ctx, func(i int) (time.Duration, int, bool) {
		if i >= len(r.cfg.Schedule) {
			return 0, 0, false
		}
		at := r.cfg.Schedule[i].At
		return at, i, r.cfg.Duration <= 0 || at < r.cfg.Duration
	})
}

// arrivals sends the i-th request at its time after the start, as next
// gives it (with its schedule index, -1 for none; ok false: no more),
// whether or not earlier ones have ended; beyond MaxInFlight running,
// an arrival is dropped.
func (r *Runner) arrivals(ctx context.Context, next func(i int) (at time.Duration, arrival int, ok bool)) {
	sem := make(chan struct{}, r.cfg.MaxInFlight)
	var wg sync.WaitGroup
	timer := time.NewTimer(0)
	defer timer.Stop()
	<-timer.C
	for i := 0; ; i++ {
		at, arrival, ok := next(i)
		if !ok {
			break
		}
		if wait := time.Until(r.start.Add(at)); wait > 0 {
			timer.Reset(wait)
			select {
			case <-timer.C:
			case <-ctx.Done():
			}
		}
		if ctx.Err() != nil {
			break
		}
		select {
		case sem <- struct{}{}:
			wg.Go(func() {
				defer func() { <-sem }()
				r.one(ctx, arrival)
			})
		default:
			r.live.Dropped.Add(1)
		}
	}
	wg.Wait()
}

// one sends one request to the next target and records its result;
// arrival is its index in the schedule, -1 without one.
func (r *Runner) one(ctx context.Context, arrival int) {
	n := r.rr.Add(1) - 1
	target := r.cfg.Targets[n%uint64(len(r.cfg.Targets))]
	r.live.Sent.Add(1)
	r.live.InFlight.Add(1)
	res := r.do(ctx, target, arrival)
	r.live.InFlight.Add(-1)
	switch res.Outcome {
	case OutcomeOK:
		r.live.OK.Add(1)
	case OutcomeRejected:
		r.live.Rejected.Add(1)
	case OutcomeCanceled:
		r.live.Canceled.Add(1)
	default:
		r.live.Failed.Add(1)
	}
	r.mu.Lock()
	r.results = append(r.results, res)
	r.mu.Unlock()
}

// requestBody returns a chat completion request whose user message has
// promptBytes bytes.
func requestBody(model string, stream bool, promptBytes int) []byte {
	var b strings.Builder
	b.Grow(promptBytes + 128)
	fmt.Fprintf(&b, `{"model":%q,"stream":%t,"messages":[{"role":"user","content":"`, model, stream)
	const filler = "lorem ipsum dolor sit amet "
	for left := promptBytes; left > 0; left -= len(filler) {
		b.WriteString(filler[:min(left, len(filler))])
	}
	b.WriteString(`"}]}`)
	return []byte(b.String())
}
