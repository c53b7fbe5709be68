package caddyfairqueue

import (
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
