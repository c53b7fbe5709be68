package caddyfairqueue

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
	"github.com/fair-queue/caddy-fair-queue/internal/jsonscan"
)

// fairHandler is a handler set up as Provision would, without a queue.
func fairHandler(t *testing.T, h *Handler) *Handler {
	t.Helper()
	h.Permits = 1
	h.setDefaults()
	require.NoError(t, h.validate())
	return h
}

// resolve runs fairRequest for a request with the given body and headers.
func resolve(h *Handler, body string, header ...string) (fairqueue.Request, *request) {
	req := newRequest(context.Background(), body, header...)
	return h.fairRequest(req.repl, jsonscan.Sniff([]byte(body))), req
}

func TestWithoutTenantOrPriorityRequestsAreFIFO(t *testing.T) {
	h := fairHandler(t, &Handler{})
	got, req := resolve(h, `{"max_tokens":100}`, "Authorization", "Bearer a")
	assert.Equal(t, fairqueue.Request{}, got)
	assert.Empty(t, req.placeholder(phTenant))
}

func TestTenantIsTheReplacedValueAndItsPlaceholderOnlyAHash(t *testing.T) {
	h := fairHandler(t, &Handler{Tenant: "{http.request.header.Authorization}"})
	got, req := resolve(h, `{}`, "Authorization", "Bearer sk-secret")
	assert.Equal(t, "Bearer sk-secret", got.Tenant)
	assert.Equal(t, 1.0, got.Weight)
	assert.Equal(t, fairqueue.TenantKey("Bearer sk-secret"), req.placeholder(phTenant))
	assert.NotContains(t, req.placeholder(phTenant), "sk-secret")

	anon, req := resolve(h, `{}`)
	assert.Empty(t, anon.Tenant, "an empty value is the default tenant")
	assert.Equal(t, fairqueue.TenantKey(""), req.placeholder(phTenant))

	long := strings.Repeat("k", 10*maxTenantLen)
	cut, _ := resolve(h, `{}`, "Authorization", long)
	assert.Len(t, cut.Tenant, maxTenantLen, "hashing is bounded")
	other, _ := resolve(h, `{}`, "Authorization", long[:maxTenantLen]+"different tail")
	assert.Equal(t, cut.Tenant, other.Tenant, "values are one tenant when their first KiB is")
}

func TestTenantWeightFromTheTableThenThePlaceholder(t *testing.T) {
	h := fairHandler(t, &Handler{
		Tenant:            "{http.request.header.X-Tenant}",
		Weights:           map[string]float64{"gold": 4, "trial": 0.25},
		WeightPlaceholder: "{http.request.header.X-Weight}",
	})
	for _, tc := range []struct {
		name, tenant, weight string
		want                 float64
	}{
		{"listed tenant", "gold", "", 4},
		{"the table wins over the placeholder", "trial", "9", 0.25},
		{"placeholder", "other", "2.5", 2.5},
		{"placeholder with spaces", "other", " 3 ", 3},
		{"absent", "other", "", 1},
		{"not a number", "other", "heavy", 1},
		{"NaN", "other", "NaN", 1},
		{"below the bound", "other", "0", minWeight},
		{"negative", "other", "-4", minWeight},
		{"above the bound", "other", "1e9", maxWeight},
		{"infinite", "other", "Inf", maxWeight},
		{"out of float range", "other", "1e999", maxWeight},
	} {
		t.Run(tc.name, func(t *testing.T) {
			header := []string{"X-Tenant", tc.tenant}
			if tc.weight != "" {
				header = append(header, "X-Weight", tc.weight)
			}
			got, _ := resolve(h, `{}`, header...)
			assert.Equal(t, tc.want, got.Weight)
		})
	}
}

func TestCostIsMaxTokensBounded(t *testing.T) {
	h := fairHandler(t, &Handler{Tenant: "{http.request.header.X-Tenant}", Cost: CostMaxTokens, MaxCost: 1000})
	for body, want := range map[string]float64{
		`{"max_tokens":256}`:                     256,
		`{"max_completion_tokens":5000}`:         1000,
		`{"max_output_tokens":0}`:                1,
		`{"messages":[]}`:                        1,
		`not json`:                               1,
		`{"max_tokens":3,"max_output_tokens":7}`: 7,
	} {
		got, _ := resolve(h, body)
		assert.Equal(t, want, got.Cost, body)
	}
	plain := fairHandler(t, &Handler{Tenant: "{http.request.header.X-Tenant}"})
	got, _ := resolve(plain, `{"max_tokens":256}`)
	assert.Zero(t, got.Cost, "without cost every request costs the engine's default, 1")

	def := fairHandler(t, &Handler{Tenant: "x", Cost: CostMaxTokens})
	got, _ = resolve(def, `{"max_tokens":1000000}`)
	assert.Equal(t, float64(DefaultMaxCost), got.Cost)
}

func TestPriorityBandIsClampedAndDefaultsToZero(t *testing.T) {
	h := fairHandler(t, &Handler{Priority: "{http.request.header.X-Priority}"})
	for value, want := range map[string]int{
		"": 0, "0": 0, "1": 1, "3": 3, "4": 3, "99999999999999999999999": 3, "-2": 0,
		"-99999999999999999999999": 0, "high": 0, "2.5": 0, " 2 ": 2,
	} {
		got, _ := resolve(h, `{}`, "X-Priority", value)
		assert.Equal(t, want, got.Priority, "priority %q", value)
		assert.Empty(t, got.Tenant, "priority alone: every request in the default tenant")
	}
}

// The engine proves fairness in depth; this checks that the handler
// hands it the tenant: a light tenant overtakes a heavy one's backlog.
func TestLightTenantOvertakesAHeavyTenantsBacklog(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	h := provisionLocal(t, newContext(t), &Handler{Name: "tenants", Permits: 1,
		Tenant: "{http.request.header.X-Tenant}", MaxQueuePerTenant: 4})
	var order []string
	next := newHolder()
	served := make(chan string, 20)
	seq := recording(next, served)

	first := newRequest(context.Background(), `{}`, "X-Tenant", "heavy").start(h, seq)
	next.waitEntered(t)
	var heavy []*request
	for i := range 4 {
		heavy = append(heavy, newRequest(context.Background(), `{}`, "X-Tenant", "heavy").start(h, seq))
		waitingIn(t, h, i+1)
	}
	full := newRequest(context.Background(), `{}`, "X-Tenant", "heavy").start(h, seq).wait(t)
	assert.Equal(t, http.StatusTooManyRequests, full.w.Code, "max_queue_per_tenant")
	assert.Equal(t, "queue_full", full.w.Header().Get("Fair-Queue-Reason"))
	light := newRequest(context.Background(), `{}`, "X-Tenant", "light").start(h, seq)
	waitingIn(t, h, 5)

	for i := range 6 {
		next.release <- struct{}{}
		order = append(order, <-served)
		if i < 5 {
			next.waitEntered(t)
		}
	}
	first.wait(t)
	light.wait(t)
	for _, r := range heavy {
		r.wait(t)
	}
	assert.Equal(t, "heavy", order[0], "the request holding the permit")
	assert.Contains(t, order[1:3], "light", "at most one grant ahead of the light tenant: %v", order)
}

// recording wraps next, sending each request's tenant header to served
// once it is done: served receives tenants in grant order.
func recording(next *holder, served chan<- string) caddyhttp.Handler {
	return caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
		defer func() { served <- r.Header.Get("X-Tenant") }()
		return next.ServeHTTP(w, r)
	})
}

func TestFairnessSettingsAreSharedQueueSettings(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	ctx := newContext(t)
	provisionLocal(t, ctx, &Handler{Name: "fq", Permits: 2, Tenant: "{http.request.remote.host}", MaxQueue: 10})
	for _, tc := range []struct {
		h    *Handler
		want string
	}{
		{&Handler{Name: "fq", Permits: 2, MaxQueue: 10}, "different fairness"},
		{&Handler{Name: "fq", Permits: 2, Tenant: "{http.request.header.A}", MaxQueue: 20}, "different max_queue (10 and 20)"},
		{&Handler{Name: "fq", Permits: 2, Tenant: "x", MaxQueue: 10, PriorityFactor: 4}, "different priority_factor (8 and 4)"},
		{&Handler{Name: "fq", Permits: 2, Tenant: "x", MaxQueue: 10, OnStoreError: FailLocal}, "different on_store_error (fail_open and local)"},
	} {
		tc.h.PollInterval = caddy.Duration(50 * time.Millisecond)
		err := tc.h.Provision(ctx)
		require.Error(t, err)
		assert.Contains(t, err.Error(), tc.want)
		require.NoError(t, tc.h.Cleanup())
	}
	// The tenant expression itself is per handler: it may differ.
	provisionLocal(t, ctx, &Handler{Name: "fq", Permits: 2, Tenant: "{http.request.header.B}", MaxQueue: 10})
}

func TestLocalFallbackIsConfiguredPerEngine(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	down := deadAddr(t)
	h := provision(t, newContext(t), down, &Handler{Name: "fallback", Permits: 4, OnStoreError: FailLocal, LocalPermits: 1})
	e := engineOf(t, h)
	cfg := e.q.Config()
	require.NotNil(t, cfg.Fallback)
	assert.Same(t, e.fallback, cfg.Fallback)
	assert.Equal(t, 1, cfg.LocalPermits)

	// Redis is down: requests queue locally, one at a time.
	next := newHolder()
	a := newRequest(context.Background(), `{}`).start(h, next)
	next.waitEntered(t)
	b := newRequest(context.Background(), `{}`).start(h, next)
	select {
	case <-next.entered:
		t.Fatal("the local queue admitted more than local_permits")
	case <-time.After(300 * time.Millisecond):
	}
	next.release <- struct{}{}
	a.wait(t)
	next.waitEntered(t)
	next.release <- struct{}{}
	b.wait(t)
	assert.Equal(t, http.StatusOK, b.w.Code)

	open := provision(t, newContext(t), down, &Handler{Name: "no-fallback", Permits: 4})
	assert.Nil(t, engineOf(t, open).q.Config().Fallback, "only with on_store_error local")
}

// goldKey is the weight key of the tenant value "Bearer sk-live-gold":
// what `printf '%s' 'Bearer sk-live-gold' | sha256sum | cut -c1-16` prints,
// the hash logs and the admin API show.
const goldKey = "sha256:a39810d3035d8502"

func TestHashedWeightIsTheTenantKeyTheLogsShow(t *testing.T) {
	require.Equal(t, goldKey, "sha256:"+fairqueue.TenantKey("Bearer sk-live-gold"))
	h := fairHandler(t, &Handler{
		Tenant:  "{http.request.header.Authorization}",
		Weights: map[string]float64{goldKey: 4, "Bearer raw": 2},
	})
	for tenant, want := range map[string]float64{
		"Bearer sk-live-gold": 4, // its hash is listed
		"Bearer raw":          2, // raw values keep working
		goldKey:               1, // a client sending the hash is another tenant
		"Bearer other":        1,
	} {
		got, req := resolve(h, `{}`, "Authorization", tenant)
		assert.Equal(t, want, got.Weight, "tenant %q", tenant)
		assert.Equal(t, fairqueue.TenantKey(tenant), req.placeholder(phTenant), "tenant %q", tenant)
	}
}

func TestMalformedHashedWeightIsAConfigErrorNamingTheOption(t *testing.T) {
	for name, key := range map[string]string{
		"empty":            "sha256:",
		"not hex":          "sha256:a39810d3035d850z",
		"too short":        "sha256:a39810d3035d850",
		"full digest":      "sha256:a39810d3035d8502" + strings.Repeat("0", 48),
		"upper case":       "sha256:A39810D3035D8502",
		"a raw key pasted": "sha256:Bearer sk-live-secret",
	} {
		t.Run(name, func(t *testing.T) {
			h := &Handler{Permits: 1, Tenant: "{http.request.header.Authorization}", Weights: map[string]float64{key: 2}}
			h.setDefaults()
			err := h.validate()
			require.Error(t, err, "JSON config")
			assert.Contains(t, err.Error(), "weight")
			assert.NotContains(t, err.Error(), "sk-live-secret", "the value, perhaps a secret, is not echoed")

			_, err = parse("fair_queue {\npermits 1\ntenant {http.request.header.Authorization}\nweight \"" + key + "\" 2\n}")
			require.Error(t, err, "Caddyfile")
			assert.Contains(t, err.Error(), "weight")
			assert.Contains(t, err.Error(), "Testfile:4", "the line")
			assert.NotContains(t, err.Error(), "sk-live-secret")
		})
	}
	_, err := parse("fair_queue {\npermits 1\ntenant {http.request.header.Authorization}\nweight \"Bearer sk-live-gold\" 2\nweight " + goldKey + " 3\n}")
	require.Error(t, err, "a tenant given both ways")
	assert.Contains(t, err.Error(), "weight")
	assert.NotContains(t, err.Error(), "sk-live-gold")
}

// A weight given by hash in the Caddyfile reaches the JSON config as the
// hash (never the raw key), and a real request of that tenant gets it:
// with weight 4 against 1, the gold tenant takes 4 of the first 5 grants
// (equal weights would alternate: at most 3).
func TestHashedWeightFromTheCaddyfileAndJSONTakesEffect(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	parsed, err := parse(`fair_queue {
		name hashed-weight
		permits 1
		tenant {http.request.header.Authorization}
		weight ` + goldKey + ` 4
	}`)
	require.NoError(t, err)
	cfg, err := json.Marshal(parsed)
	require.NoError(t, err)
	assert.Contains(t, string(cfg), `"weights":{"`+goldKey+`":4}`)
	h := new(Handler)
	require.NoError(t, json.Unmarshal(cfg, h))
	provisionLocal(t, newContext(t), h)
	assert.Equal(t, 4, goldGrants(t, h), "the gold tenant's grants of the first 5 after the holder")
}
