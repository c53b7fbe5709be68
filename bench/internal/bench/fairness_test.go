package bench

import (
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/internal/loadgen"
)

func TestSpanRecorderRecordsTenantRequestsOnly(t *testing.T) {
	t.Parallel()
	rec := &spanRecorder{next: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		time.Sleep(2 * time.Millisecond)
	})}
	for _, tenant := range []string{"a", "", "b"} {
		r := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", nil)
		if tenant != "" {
			r.Header.Set(HeaderTenant, tenant)
		}
		rec.ServeHTTP(httptest.NewRecorder(), r)
	}
	spans, upMax := rec.take()
	require.Len(t, spans, 2)
	assert.Equal(t, "a", spans[0].tenant)
	assert.Equal(t, "b", spans[1].tenant)
	assert.GreaterOrEqual(t, spans[0].end.Sub(spans[0].start), 2*time.Millisecond)
	assert.Equal(t, 1, upMax)
	spans, _ = rec.take()
	assert.Empty(t, spans, "take forgets")
}

func TestFairSharesClipToTheRunAndSplitIntoWindows(t *testing.T) {
	t.Parallel()
	set := FairnessSettings{Permits: 2, DurationS: 2, WindowS: 1, TokenDelayUS: 1000, Tenants: []FairTenantLoad{
		{Tenant: TenantLong, Clients: 2, Tokens: 400},
		{Tenant: TenantChat, Clients: 1, Tokens: 100},
	}}
	t0 := time.Unix(1000, 0)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	spans := []span{
		{TenantLong, at(0), at(1500)},    // 1 s in window 0, 0.5 s in window 1
		{TenantLong, at(1500), at(2500)}, // 0.5 s in window 1, the rest after the run
		{TenantChat, at(100), at(200)},   // chat's first request, sent at 0
		{TenantChat, at(300), at(400)},   // its second, sent at 250
		{"other", at(0), at(2000)},       // not a tenant of the run
		{TenantChat, at(2100), at(2200)}, // after the run: no request, no time
	}
	clients := []clientRun{
		{},
		{started: t0, results: []loadgen.Result{
			{Start: 0, Total: 200 * time.Millisecond, Outcome: loadgen.OutcomeOK},
			{Start: 250 * time.Millisecond, Total: 150 * time.Millisecond, Outcome: loadgen.OutcomeOK},
			{Start: 2050 * time.Millisecond, Total: 150 * time.Millisecond, Outcome: loadgen.OutcomeOK},
			{Start: 2300 * time.Millisecond, Outcome: loadgen.OutcomeRejected},
		}},
	}
	got := fairShares(set, spans, clients, t0)
	require.Len(t, got, 2)
	long, chat := got[0], got[1]
	assert.InDelta(t, 2.0, long.PermitS, 1e-9)
	assert.InDelta(t, 0.2, chat.PermitS, 1e-9)
	assert.InDelta(t, 2.0/2.2, long.PermitShare, 1e-4)
	assert.Equal(t, 2, long.Requests)
	assert.Equal(t, 2, chat.Requests)
	assert.InDelta(t, 0.5, chat.RequestShare, 1e-9)
	assert.InDeltaSlice(t, []float64{1 / 1.2, 1}, long.Shares, 1e-4)
	assert.InDeltaSlice(t, []float64{0.2 / 1.2, 0}, chat.Shares, 1e-4)
	// Chat's waits are exact: upstream arrival minus the client's send.
	assert.Equal(t, 50.0, chat.WaitP50) // 100, 50, 50 ms
	assert.Equal(t, 100.0, chat.WaitP99)
	assert.Equal(t, 1, chat.Rejected)
	assert.Equal(t, 100.0, chat.ServiceMS)
}

func fairnessFixture() *Fairness {
	set := fairnessSettings(true)
	f := &Fairness{Settings: set, System: "fair_queue Redis 2 nodes, 2 permits"}
	nw := int(set.DurationS / set.WindowS)
	shares := func(v float64) []float64 {
		s := make([]float64, nw)
		for i := range s {
			s[i] = v
		}
		return s
	}
	for _, m := range FairModes() {
		run := &FairRun{Mode: m, UpstreamMax: 2}
		long, short := 0.76, 0.19
		if m.Cost == "time" {
			long, short = 0.36, 0.34
		}
		if m.Cost == "tokens" {
			long, short = 0.45, 0.30
		}
		run.Tenants = []*FairTenant{
			{Tenant: TenantLong, PermitS: long * 8, PermitShare: long, Requests: 40, RequestShare: 0.4, Shares: shares(long)},
			{Tenant: TenantShort, PermitS: short * 8, PermitShare: short, Requests: 40, RequestShare: 0.4, Shares: shares(short)},
			{Tenant: TenantChat, PermitS: (1 - long - short) * 8, PermitShare: 1 - long - short, Requests: 20, RequestShare: 0.2,
				Shares: shares(1 - long - short), WaitP50: 12, WaitP99: 70},
		}
		f.Runs = append(f.Runs, run)
	}
	return f
}

func TestFairnessChecksReportTheHeavyTenantsSplit(t *testing.T) {
	t.Parallel()
	got := map[string]string{}
	for _, c := range fairnessChecks(fairnessFixture()) {
		got[c.Target] = c.Result + " " + c.Value
	}
	assert.Equal(t, map[string]string{
		TargetFairTime:   "pass long 51.4%, short 48.6% of their permit-time (2.9 / 2.7 s; 36.0% / 34.0% of all, chat 30.0%)",
		TargetFairTokens: "FAIL long 60.0%, short 40.0% of their permit-time (3.6 / 2.4 s; 45.0% / 30.0% of all, chat 25.0%)",
	}, got)
}

func TestFairnessSectionAndPlotAreWritten(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	res := &Results{Mode: "quick", Settings: settings(true), Machine: Machine{CPUs: 2}, Fairness: fairnessFixture()}
	res.Fairness.Runs[3].Error = "cost: unknown mode | tokens"
	res.Checks = evaluate(res)
	plots, err := writePlots(res, dir)
	require.NoError(t, err)
	assert.Equal(t, []string{PlotFairness}, plots)
	st, err := os.Stat(filepath.Join(dir, PlotFairness))
	require.NoError(t, err)
	assert.Positive(t, st.Size())

	md := markdown(res, Options{OutDir: "bench-results", Markdown: "BENCHMARKS.md"}, plots)
	assert.Contains(t, md, "## Fairness")
	assert.Contains(t, md, "**strict FIFO (no tenant)** (long 80.0% / short 20.0%")
	assert.Contains(t, md, "| chat | 1 | 0.40 | 5.0% | 20 | 20.0% |")
	assert.Contains(t, md, "**cost tokens**: not measured: `cost: unknown mode / tokens`")
	assert.Contains(t, md, "](bench-results/"+PlotFairness+")")
	assert.Contains(t, md, "long down to 36% and (not run)")
	assert.Contains(t, md, "| "+TargetFairTokens+" | fair_queue Redis 2 nodes, 2 permits (cost tokens) | not measured")
	assert.False(t, strings.Contains(md, "%!"), "no formatting errors")
}
