package caddyfairqueue

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
)

// getPage calls the status page's handler with method and target.
func getPage(t *testing.T, method, target string) (*httptest.ResponseRecorder, error) {
	t.Helper()
	rec := httptest.NewRecorder()
	err := StatusPage{}.ServeHTTP(rec, httptest.NewRequest(method, target, nil), nil)
	return rec, err
}

func TestStatusPageIsAModuleOfItsOwn(t *testing.T) {
	mod, err := caddy.GetModule("http.handlers.fair_queue_status")
	require.NoError(t, err)
	_, ok := mod.New().(caddyhttp.MiddlewareHandler)
	assert.True(t, ok)
}

func TestStatusPageServesHTMLThatPollsItsJSON(t *testing.T) {
	rec, err := getPage(t, http.MethodGet, "/fair_queue/status")
	require.NoError(t, err)
	assert.Equal(t, http.StatusOK, rec.Code)
	assert.Equal(t, "text/html; charset=utf-8", rec.Header().Get("Content-Type"))
	assert.Equal(t, "no-store", rec.Header().Get("Cache-Control"))
	body := rec.Body.String()
	_, script, ok := strings.Cut(body, "<script>")
	require.True(t, ok, "an inline script")
	assert.Contains(t, script, `"?format=json"`, "the script reads the JSON of its own URL")
	assert.NotContains(t, script, "innerHTML", "values are set as text, never parsed as HTML")
	assert.NotContains(t, body, "://", "no external asset, no CDN")

	csp := rec.Header().Get("Content-Security-Policy")
	assert.Contains(t, csp, "default-src 'none'")
	assert.Contains(t, csp, "connect-src 'self'")
	assert.Contains(t, csp, "script-src "+inlineHash(statusHTML, "script")+";", "only the page's own script runs")
	assert.NotContains(t, csp, "unsafe-inline")
}

func TestStatusPageJSONIsTheAdminAPIs(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	h := &Handler{Name: "status-json", Permits: 3, PollInterval: caddy.Duration(50 * time.Millisecond)}
	require.NoError(t, h.Provision(newContext(t)))
	t.Cleanup(func() { _ = h.Cleanup() })

	rec, err := getPage(t, http.MethodGet, "/fair_queue/status?format=json")
	require.NoError(t, err)
	assert.Equal(t, "application/json", rec.Header().Get("Content-Type"))
	admin, err := getStatus(t, http.MethodGet, "/fair_queue/")
	require.NoError(t, err)
	assert.JSONEq(t, admin.Body.String(), rec.Body.String())
	assert.Contains(t, rec.Body.String(), `"name":"status-json"`)
}

// The page shows a queue's tokens from the JSON it reads: kv's capacity,
// tokens_held and node_tokens_held, bytes_per_token and samples, and
// each pool upstream's kv_tokens and tokens_held (e2e/status shows them
// rendered).
func TestStatusPageJSONCarriesTheTokensThePageShows(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	h := &Handler{Name: "status-kv", Upstreams: []fairqueue.Upstream{{Dial: "a:1", Permits: 2, KVTokens: 500}},
		PollInterval: caddy.Duration(50 * time.Millisecond)}
	require.NoError(t, h.Provision(newContext(t)))
	t.Cleanup(func() { _ = h.Cleanup() })
	next := newHolder()
	body := `{"max_tokens":100,"messages":[{"role":"user","content":"` + strings.Repeat("a", 400) + `"}]}`
	req := newRequest(context.Background(), body).start(h, next) // 400/4 + 100 tokens
	next.waitEntered(t)

	rec, err := getPage(t, http.MethodGet, "/fair_queue/status?format=json")
	require.NoError(t, err)
	var page struct {
		Queues []struct {
			KV       json.RawMessage `json:"kv"`
			Snapshot struct {
				Upstreams []json.RawMessage `json:"upstreams"`
			} `json:"snapshot"`
		} `json:"queues"`
	}
	require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &page))
	require.Len(t, page.Queues, 1)
	q := page.Queues[0]
	assert.JSONEq(t, `{"bytes_per_token":4,"samples":0,"capacity":500,"tokens_held":200,"node_tokens_held":200,
		"completion_budget":0,"completion_samples":0}`, string(q.KV))
	require.Len(t, q.Snapshot.Upstreams, 1)
	assert.JSONEq(t, `{"dial":"a:1","permits":2,"in_flight":1,"cool_left_ms":0,"kv_tokens":500,"tokens_held":200}`,
		string(q.Snapshot.Upstreams[0]))

	next.release <- struct{}{}
	req.wait(t)
	settled(t, h)
}

func TestStatusPageIsReadOnly(t *testing.T) {
	for _, method := range []string{http.MethodPost, http.MethodPut, http.MethodDelete, http.MethodPatch} {
		rec, err := getPage(t, method, "/")
		var he caddyhttp.HandlerError
		require.True(t, errors.As(err, &he), method)
		assert.Equal(t, http.StatusMethodNotAllowed, he.StatusCode, method)
		assert.Equal(t, "GET, HEAD", rec.Header().Get("Allow"), method)
		assert.Zero(t, rec.Body.Len(), method)
	}
	rec, err := getPage(t, http.MethodHead, "/")
	require.NoError(t, err)
	assert.Equal(t, "text/html; charset=utf-8", rec.Header().Get("Content-Type"))
	assert.Zero(t, rec.Body.Len())
}

func TestStatusPageDirectiveTakesNoArgumentsNorBlock(t *testing.T) {
	for _, tc := range []struct{ input, err string }{
		{"fair_queue_status", ""},
		{"fair_queue_status extra", "wrong argument count"},
		{"fair_queue_status {\n\tpermits 1\n}", "unrecognized subdirective 'permits'"},
	} {
		err := new(StatusPage).UnmarshalCaddyfile(caddyfile.NewTestDispenser(tc.input))
		if tc.err == "" {
			assert.NoError(t, err, tc.input)
		} else {
			assert.ErrorContains(t, err, tc.err, tc.input)
		}
	}
}
