package bench

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/fair-queue/caddy-fair-queue/bench/internal/systems"
	"github.com/fair-queue/caddy-fair-queue/internal/loadgen"
	"github.com/fair-queue/caddy-fair-queue/internal/mockllm"
)

// The fairness scenario: a few permits, three tenants in closed loops. The
// heavy tenants "long" and "short" have as many clients each, and a
// request of "long" holds its permit 4x longer (4x the tokens at the same
// time per token); "chat" has one client, which sends its next request
// when its answer came, as a chat user does. It runs once per queue mode
// (FairModes): strict FIFO, then fair by count, by permit-time and by
// tokens. The permit-time of each request is measured at the upstream
// (an in-process mockllm that records when each request arrived and
// ended, and for which tenant).
const (
	TenantLong  = "long"
	TenantShort = "short"
	TenantChat  = "chat"

	// HeaderTenant carries the tenant of a request; fair_queue reads it
	// with TenantPlaceholder.
	HeaderTenant      = "X-Tenant"
	TenantPlaceholder = "{http.request.header." + HeaderTenant + "}"
)

// Fairness targets, reported (a missed one is a result, not a failure).
const (
	TargetFairTime   = "cost time: long and short each 42-58% of their permit-time"
	TargetFairTokens = "cost tokens: long and short each 42-58% of their permit-time"
)

// FairMode is one queue configuration of the fairness scenario.
type FairMode struct {
	// Name is short ("fifo", "requests"...); Label how tables show it.
	Name  string `json:"name"`
	Label string `json:"label"`
	// Tenant sets fair_queue's tenant (else strict FIFO); Cost its cost
	// mode ("" for the default, requests).
	Tenant bool   `json:"tenant"`
	Cost   string `json:"cost,omitempty"`
}

// FairModes are the queue modes the fairness scenario runs, FIFO first.
func FairModes() []FairMode {
	return []FairMode{
		{Name: "fifo", Label: "strict FIFO (no tenant)"},
		{Name: "requests", Label: "cost requests", Tenant: true},
		{Name: "time", Label: "cost time", Tenant: true, Cost: "time"},
		{Name: "tokens", Label: "cost tokens", Tenant: true, Cost: "tokens"},
	}
}

// FairTenantLoad is the load of one tenant.
type FairTenantLoad struct {
	// Tenant is its name, sent as HeaderTenant.
	Tenant string `json:"tenant"`
	// Clients is its closed-loop concurrency.
	Clients int `json:"clients"`
	// Tokens is the answer's length (X-Mock-Tokens): with the settings'
	// TokenDelayUS, the upstream time of one request.
	Tokens int `json:"tokens"`
}

// FairnessSettings shape the fairness scenario.
type FairnessSettings struct {
	// Permits and Nodes configure the fair_queue (Redis store, the
	// clients' requests round-robin over the nodes).
	Permits int `json:"permits"`
	Nodes   int `json:"nodes"`
	// DurationS is how long each mode runs; WindowS the width of the
	// windows the shares are taken over, in seconds.
	DurationS float64 `json:"duration_s"`
	WindowS   float64 `json:"window_s"`
	// TokenDelayUS is the upstream's time per token (X-Mock-Delay: an
	// unstreamed answer comes after tokens x delay).
	TokenDelayUS float64 `json:"token_delay_us"`
	// Tenants are the loads, long first.
	Tenants []FairTenantLoad `json:"tenants"`
}

// ServiceMS is the upstream time of one request of l.
func (s FairnessSettings) ServiceMS(l FairTenantLoad) float64 {
	return float64(l.Tokens) * s.TokenDelayUS / 1000
}

// fairnessSettings returns the scenario of a quick or a full run.
func fairnessSettings(quick bool) FairnessSettings {
	s := FairnessSettings{
		Permits: 2, Nodes: 2, DurationS: 15, WindowS: 1, TokenDelayUS: 100,
		Tenants: []FairTenantLoad{
			{Tenant: TenantLong, Clients: 4, Tokens: 800},
			{Tenant: TenantShort, Clients: 4, Tokens: 200},
			{Tenant: TenantChat, Clients: 1, Tokens: 200},
		},
	}
	if quick {
		s.DurationS, s.WindowS = 4, 0.5
	}
	return s
}

// Fairness is what the fairness scenario measured.
type Fairness struct {
	// Settings is the scenario; System describes the queue.
	Settings FairnessSettings `json:"settings"`
	System   string           `json:"system"`
	// Runs holds one run per mode, in the order of FairModes.
	Runs []*FairRun `json:"runs"`
	// Error says why the scenario could not run at all.
	Error string `json:"error,omitempty"`
}

// FairRun is one mode of the fairness scenario.
type FairRun struct {
	// Mode is the queue mode.
	Mode FairMode `json:"mode"`
	// Tenants holds one entry per tenant, in the order of the settings.
	Tenants []*FairTenant `json:"tenants"`
	// UpstreamMax is the most requests the upstream served at once.
	UpstreamMax int `json:"upstream_max_in_flight"`
	// Error says why the mode could not be measured.
	Error string `json:"error,omitempty"`
}

// tenant returns the entry of the tenant named name, or nil.
func (r *FairRun) tenant(name string) *FairTenant {
	for _, t := range r.Tenants {
		if t.Tenant == name {
			return t
		}
	}
	return nil
}

// PairShare is long's share of the permit-time long and short had
// together: 0.5 when the two heavy tenants got equal use; -1 when
// neither ran.
func (r *FairRun) PairShare() float64 {
	l, s := r.tenant(TenantLong), r.tenant(TenantShort)
	if l == nil || s == nil || l.PermitS+s.PermitS <= 0 {
		return -1
	}
	return l.PermitS / (l.PermitS + s.PermitS)
}

// FairTenant is what one tenant got in one mode, over the run's duration
// (requests still running at its end count up to the end; the drain
// after it, when no one is backlogged any more, is left out).
type FairTenant struct {
	// Tenant is its name.
	Tenant string `json:"tenant"`
	// Requests is the requests that reached the upstream in the run;
	// Failed and Rejected count the client's failures and rejects.
	Requests int `json:"requests"`
	Failed   int `json:"failed"`
	Rejected int `json:"rejected"`
	// PermitS is the upstream time of its requests (a permit held each),
	// in seconds; PermitShare and RequestShare its share of all tenants'
	// permit-time and requests.
	PermitS      float64 `json:"permit_s"`
	PermitShare  float64 `json:"permit_share"`
	RequestShare float64 `json:"request_share"`
	// ServiceMS is the median upstream time of one of its requests.
	ServiceMS float64 `json:"service_ms"`
	// WaitP50 and WaitP99 are the time its requests spent before the
	// upstream (queued, plus the proxy), ms: exact for a one-client
	// tenant (its requests matched with their upstream spans in order),
	// else the client's total time minus ServiceMS.
	WaitP50 float64 `json:"wait_p50_ms"`
	WaitP99 float64 `json:"wait_p99_ms"`
	// Shares is its share of the permit-time in each window of the run.
	Shares []float64 `json:"shares"`
}

// span is one request at the upstream.
type span struct {
	tenant     string
	start, end time.Time
}

// spanRecorder is an upstream that records the span of every completion
// request that names a tenant, and counts how many run at once.
type spanRecorder struct {
	next http.Handler

	mu       sync.Mutex
	spans    []span
	inFlight int
	max      int
}

func (s *spanRecorder) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	tenant := r.Header.Get(HeaderTenant)
	if tenant == "" || !strings.HasSuffix(r.URL.Path, "/completions") {
		s.next.ServeHTTP(w, r)
		return
	}
	s.mu.Lock()
	s.inFlight++
	s.max = max(s.max, s.inFlight)
	s.mu.Unlock()
	start := time.Now()
	s.next.ServeHTTP(w, r)
	end := time.Now()
	s.mu.Lock()
	s.inFlight--
	s.spans = append(s.spans, span{tenant: tenant, start: start, end: end})
	s.mu.Unlock()
}

// take returns the spans recorded and the highest concurrency since the
// last take, and forgets them.
func (s *spanRecorder) take() ([]span, int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	spans, m := s.spans, s.max
	s.spans, s.max = nil, s.inFlight
	return spans, m
}

// runFairness runs the fairness scenario, each mode on a fresh fair_queue
// (a queue of its own in Redis), in front of an in-process recording
// upstream.
func (b *bench) runFairness(ctx context.Context) {
	set := fairnessSettings(b.opts.Quick)
	f := &Fairness{Settings: set, System: fmt.Sprintf("fair_queue Redis %d nodes, %d permits", set.Nodes, set.Permits)}
	b.res.Fairness = f
	b.logf("== fairness: %s, %.0f s per mode", f.System, set.DurationS)

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		f.Error = err.Error()
		return
	}
	rec := &spanRecorder{next: mockllm.New(mockllm.Config{Tokens: 1}).Handler()}
	srv := &http.Server{Handler: rec, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	defer srv.Close()

	env := *b.env
	env.MockAddr, env.Permits = ln.Addr().String(), set.Permits
	for _, mode := range FairModes() {
		if ctx.Err() != nil {
			return
		}
		run := b.fairRun(ctx, &env, rec, set, mode)
		f.Runs = append(f.Runs, run)
		if run.Error != "" {
			b.logf("   %-24s failed: %v", mode.Label, oneLine(run.Error, 300))
			continue
		}
		var parts []string
		for _, t := range run.Tenants {
			parts = append(parts, fmt.Sprintf("%s %4.1f%% time %4.1f%% req", t.Tenant, 100*t.PermitShare, 100*t.RequestShare))
		}
		chat := run.tenant(TenantChat)
		b.logf("   %-24s %s; chat wait p50 %.1f p99 %.1f ms; upstream max %d",
			mode.Label, strings.Join(parts, ", "), chat.WaitP50, chat.WaitP99, run.UpstreamMax)
	}
}

// fairRun runs one mode: a fresh system, every tenant's closed loop at
// once for the duration, the shares taken from the upstream's spans.
func (b *bench) fairRun(ctx context.Context, env *systems.Env, rec *spanRecorder, set FairnessSettings, mode FairMode) *FairRun {
	run := &FairRun{Mode: mode}
	spec := systems.Spec{
		Name: "fair-" + mode.Name, Label: "fair_queue " + mode.Label, Kind: systems.KindFairQueue,
		Nodes: set.Nodes, Redis: true, Cost: mode.Cost,
	}
	if mode.Tenant {
		spec.Tenant = TenantPlaceholder
	}
	r, err := env.Start(ctx, spec)
	if err != nil {
		run.Error = err.Error()
		return run
	}
	defer env.Stop(r)
	if err := b.warm(ctx, r); err != nil { // no tenant header: not recorded
		run.Error = err.Error()
		return run
	}
	rec.take()

	dur := secs(set.DurationS)
	reports := make([]*loadgen.Report, len(set.Tenants))
	errs := make([]error, len(set.Tenants))
	t0 := time.Now()
	var wg sync.WaitGroup
	for i, l := range set.Tenants {
		wg.Go(func() {
			reports[i], errs[i] = b.load(ctx, r.Targets, loadgen.Config{
				Clients: l.Clients, Duration: dur, Tokens: l.Tokens,
				Delay:  time.Duration(set.TokenDelayUS * float64(time.Microsecond)),
				Header: http.Header{HeaderTenant: {l.Tenant}},
			})
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		run.Error = err.Error()
		return run
	}
	if ctx.Err() != nil {
		run.Error = ctx.Err().Error()
		return run
	}
	spans, upMax := rec.take()
	run.UpstreamMax = upMax
	clients := make([]clientRun, len(reports))
	for i, rep := range reports {
		clients[i] = clientRun{started: rep.Started, results: rep.All()}
	}
	run.Tenants = fairShares(set, spans, clients, t0)
	return run
}
