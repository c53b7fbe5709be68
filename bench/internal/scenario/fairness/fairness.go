// Package fairness runs the fairness scenario: three tenants in closed
// loops against a few permits, once per queue mode (report.FairModes),
// each request's permit-time measured at an in-process upstream. Its
// figures and their report are report.Fairness.
package fairness

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/fair-queue/caddy-fair-queue/bench/internal/report"
	"github.com/fair-queue/caddy-fair-queue/bench/internal/scenario"
	"github.com/fair-queue/caddy-fair-queue/bench/internal/systems"
	"github.com/fair-queue/caddy-fair-queue/internal/loadgen"
	"github.com/fair-queue/caddy-fair-queue/internal/mockllm"
)

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

// ServeHTTP serves r upstream and records its span when it is a
// tenant's completion.
func (s *spanRecorder) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	tenant := r.Header.Get(report.HeaderTenant)
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

// Run runs the fairness scenario, each mode on a fresh fair_queue
// (a queue of its own in Redis), in front of an in-process recording
// upstream.
func Run(ctx context.Context, b *scenario.Runner) {
	set := report.DefaultFairnessSettings(b.Quick)
	f := &report.Fairness{Settings: set, System: fmt.Sprintf("fair_queue Redis %d nodes, %d permits", set.Nodes, set.Permits)}
	b.Res.Fairness = f
	b.Logf("== fairness: %s, %.0f s per mode", f.System, set.DurationS)

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		f.Error = err.Error()
		return
	}
	rec := &spanRecorder{next: mockllm.New(mockllm.Config{Tokens: 1}).Handler()}
	srv := &http.Server{Handler: rec, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	defer srv.Close()

	env := *b.Env
	env.MockAddr, env.Permits = ln.Addr().String(), set.Permits
	for _, mode := range report.FairModes() {
		if ctx.Err() != nil {
			return
		}
		run := fairRun(ctx, b, &env, rec, set, mode)
		f.Runs = append(f.Runs, run)
		if run.Error != "" {
			b.Logf("   %-24s failed: %v", mode.Label, report.OneLine(run.Error, 300))
			continue
		}
		var parts []string
		for _, t := range run.Tenants {
			parts = append(parts, fmt.Sprintf("%s %4.1f%% time %4.1f%% req", t.Tenant, 100*t.PermitShare, 100*t.RequestShare))
		}
		chat := run.Tenant(report.TenantChat)
		b.Logf("   %-24s %s; chat wait p50 %.1f p99 %.1f ms; upstream max %d",
			mode.Label, strings.Join(parts, ", "), chat.WaitP50, chat.WaitP99, run.UpstreamMax)
	}
}

// fairRun runs one mode: a fresh system, every tenant's closed loop at
// once for the duration, the shares taken from the upstream's spans.
func fairRun(ctx context.Context, b *scenario.Runner, env *systems.Env, rec *spanRecorder, set report.FairnessSettings, mode report.FairMode) *report.FairRun {
	run := &report.FairRun{Mode: mode}
	spec := systems.Spec{
		Name: "fair-" + mode.Name, Label: "fair_queue " + mode.Label, Kind: systems.KindFairQueue,
		Nodes: set.Nodes, Redis: true, Cost: mode.Cost,
	}
	if mode.Tenant {
		spec.Tenant = report.TenantPlaceholder
	}
	r, err := env.Start(ctx, spec)
	if err != nil {
		run.Error = err.Error()
		return run
	}
	defer env.Stop(r)
	if err := b.Warm(ctx, r); err != nil { // no tenant header: not recorded
		run.Error = err.Error()
		return run
	}
	rec.take()

	dur := report.Secs(set.DurationS)
	reports := make([]*loadgen.Report, len(set.Tenants))
	errs := make([]error, len(set.Tenants))
	t0 := time.Now()
	var wg sync.WaitGroup
	for i, l := range set.Tenants {
		wg.Go(func() {
			reports[i], errs[i] = b.Load(ctx, r.Targets, loadgen.Config{
				Clients: l.Clients, Duration: dur, Tokens: l.Tokens,
				Delay:  time.Duration(set.TokenDelayUS * float64(time.Microsecond)),
				Header: http.Header{report.HeaderTenant: {l.Tenant}},
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

// clientRun is what one tenant's clients saw: when their load started,
// and each request's result (its Start is since then).
type clientRun struct {
	started time.Time
	results []loadgen.Result
}

// fairShares measures each tenant's permit-time, requests and waits from
// the upstream spans and what the clients saw (clients[i] is the load of
// set.Tenants[i]), over [t0, t0 + duration], in windows of set.WindowS.
func fairShares(set report.FairnessSettings, spans []span, clients []clientRun, t0 time.Time) []*report.FairTenant {
	end := t0.Add(report.Secs(set.DurationS))
	window := report.Secs(set.WindowS)
	nw := max(1, int((report.Secs(set.DurationS)+window-1)/window))
	perWindow := make([][]float64, len(set.Tenants)) // seconds, per tenant and window
	out := make([]*report.FairTenant, len(set.Tenants))
	index := map[string]int{}
	for i, l := range set.Tenants {
		out[i] = &report.FairTenant{Tenant: l.Tenant, Shares: make([]float64, nw)}
		perWindow[i] = make([]float64, nw)
		index[l.Tenant] = i
	}
	byTenant := make([][]span, len(set.Tenants))
	var totalS float64
	totalReq := 0
	for _, sp := range spans {
		i, ok := index[sp.tenant]
		if !ok {
			continue
		}
		byTenant[i] = append(byTenant[i], sp)
		if !sp.start.Before(t0) && sp.start.Before(end) {
			out[i].Requests++
			totalReq++
		}
		for w := range nw {
			ws := t0.Add(time.Duration(w) * window)
			we := ws.Add(window)
			if we.After(end) {
				we = end
			}
			if d := overlap(sp.start, sp.end, ws, we); d > 0 {
				perWindow[i][w] += d.Seconds()
				out[i].PermitS += d.Seconds()
				totalS += d.Seconds()
			}
		}
	}
	for w := range nw {
		var sum float64
		for i := range out {
			sum += perWindow[i][w]
		}
		for i := range out {
			if sum > 0 {
				out[i].Shares[w] = report.Round(perWindow[i][w]/sum, 4)
			}
		}
	}
	for i, t := range out {
		if totalS > 0 {
			t.PermitShare = report.Round(t.PermitS/totalS, 4)
		}
		if totalReq > 0 {
			t.RequestShare = report.Round(float64(t.Requests)/float64(totalReq), 4)
		}
		t.PermitS = report.Round(t.PermitS, 3)
		sps := byTenant[i]
		slices.SortFunc(sps, func(a, b span) int { return a.start.Compare(b.start) })
		service := make([]time.Duration, len(sps))
		for j, sp := range sps {
			service[j] = sp.end.Sub(sp.start)
		}
		slices.Sort(service)
		median := loadgen.Percentile(service, 50)
		t.ServiceMS = report.MSOf(median)
		if i >= len(clients) {
			continue
		}
		cr := clients[i]
		var ok []loadgen.Result
		for _, res := range cr.results {
			switch res.Outcome {
			case loadgen.OutcomeOK:
				ok = append(ok, res)
			case loadgen.OutcomeRejected:
				t.Rejected++
			case loadgen.OutcomeFailed:
				t.Failed++
			}
		}
		slices.SortFunc(ok, func(a, b loadgen.Result) int { return int(a.Start - b.Start) })
		exact := set.Tenants[i].Clients == 1 && len(ok) == len(sps)
		waits := make([]time.Duration, 0, len(ok))
		for j, res := range ok {
			var w time.Duration
			if exact {
				w = sps[j].start.Sub(cr.started.Add(res.Start))
			} else {
				w = res.Total - median
			}
			waits = append(waits, max(w, 0))
		}
		slices.Sort(waits)
		t.WaitP50 = report.MSOf(loadgen.Percentile(waits, 50))
		t.WaitP99 = report.MSOf(loadgen.Percentile(waits, 99))
	}
	return out
}

// overlap is the length of [a0, a1] inside [b0, b1].
func overlap(a0, a1, b0, b1 time.Time) time.Duration {
	s, e := a0, a1
	if b0.After(s) {
		s = b0
	}
	if b1.Before(e) {
		e = b1
	}
	return max(e.Sub(s), 0)
}
