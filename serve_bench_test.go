package caddyfairqueue

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"
)

// BenchmarkServeHTTPFastPath is fair_queue's own work on a request that
// finds a permit free, on the local store: reading and sniffing the
// body, the grant, the placeholders, metrics and log fields, and the
// release. The next handler does nothing, so this is what the queue adds
// to a request's CPU in front of reverse_proxy (compare with the bench's
// CPU per request).
func BenchmarkServeHTTPFastPath(b *testing.B) {
	ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
	defer cancel()
	h := &Handler{Name: "bench", Permits: 4}
	if err := h.Provision(ctx); err != nil {
		b.Fatal(err)
	}
	defer func() { _ = h.Cleanup() }()
	h.logger = zap.NewNop() // as at Caddy's default INFO level: no per-request log
	b.ReportAllocs()
	for b.Loop() {
		if err := h.ServeHTTP(httptest.NewRecorder(), benchRequest(), okHandler); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkServeHTTPBaseline is the request setup of
// BenchmarkServeHTTPFastPath without fair_queue: subtract it.
func BenchmarkServeHTTPBaseline(b *testing.B) {
	b.ReportAllocs()
	for b.Loop() {
		sink = benchRequest() // escapes, as the request handed to ServeHTTP does
		httptest.NewRecorder().WriteHeader(http.StatusOK)
	}
}

var sink *http.Request

var benchBody = `{"model":"m","messages":[{"role":"user","content":"` + strings.Repeat("x", 1024) + `"}]}`

// benchRequest is a chat request with what Caddy gives a handler: a
// replacer and the access log's extra fields.
func benchRequest() *http.Request {
	r := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", strings.NewReader(benchBody))
	c := context.WithValue(r.Context(), caddy.ReplacerCtxKey, caddy.NewReplacer())
	c = context.WithValue(c, caddyhttp.ExtraLogFieldsCtxKey, new(caddyhttp.ExtraLogFields))
	return r.WithContext(c)
}
