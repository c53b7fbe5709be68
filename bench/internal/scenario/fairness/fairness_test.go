package fairness

import (
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/bench/internal/report"
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
			r.Header.Set(report.HeaderTenant, tenant)
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
	set := report.FairnessSettings{Permits: 2, DurationS: 2, WindowS: 1, TokenDelayUS: 1000, Tenants: []report.FairTenantLoad{
		{Tenant: report.TenantLong, Clients: 2, Tokens: 400},
		{Tenant: report.TenantChat, Clients: 1, Tokens: 100},
	}}
	t0 := time.Unix(1000, 0)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	spans := []span{
		{report.TenantLong, at(0), at(1500)},    // 1 s in window 0, 0.5 s in window 1
		{report.TenantLong, at(1500), at(2500)}, // 0.5 s in window 1, the rest after the run
		{report.TenantChat, at(100), at(200)},   // chat's first request, sent at 0
		{report.TenantChat, at(300), at(400)},   // its second, sent at 250
		{"other", at(0), at(2000)},              // not a tenant of the run
		{report.TenantChat, at(2100), at(2200)}, // after the run: no request, no time
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
