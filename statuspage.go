package caddyfairqueue

import (
	"bytes"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	_ "embed"
)

func init() {
	caddy.RegisterModule(StatusPage{})
}

// statusHTML is the page; its inline script and style are allowed by
// their hashes in statusCSP, and by nothing else.
//
//go:embed web/status.html
var statusHTML []byte

// statusCSP lets the page run its own script and style and fetch from
// its own origin, nothing more: no other script, frame, form or image
// (its icon is an empty data: URL, so that the browser asks the site
// for no /favicon.ico, which a fair_queue there might queue).
var statusCSP = fmt.Sprintf("default-src 'none'; script-src %s; style-src %s; connect-src 'self'; "+
	"img-src data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
	inlineHash(statusHTML, "script"), inlineHash(statusHTML, "style"))

// inlineHash returns the CSP source ('sha256-...') of the content of
// the first <tag> element of page; it panics if there is none, which
// the tests of the embedded page would show at once.
func inlineHash(page []byte, tag string) string {
	_, rest, ok := bytes.Cut(page, []byte("<"+tag+">"))
	body, _, ok2 := bytes.Cut(rest, []byte("</"+tag+">"))
	if !ok || !ok2 {
		panic("web/status.html: no <" + tag + "> element")
	}
	sum := sha256.Sum256(body)
	return "'sha256-" + base64.StdEncoding.EncodeToString(sum[:]) + "'"
}

// StatusPage is the http.handlers.fair_queue_status module: a page for
// an operator's browser that shows every queue this Caddy instance
// serves (store, permits, waiting here and across the cluster, in
// flight, with kv_tokens the tokens held against it, the prompt
// estimate, each upstream of a pool with its own tokens held, the
// busiest tenant flows), refreshed every second. With ?format=json it answers what the admin API's GET
// /fair_queue/ answers. It is read-only: other methods than GET and
// HEAD get 405.
//
// It is a site handler, not an admin route, because browsers cannot
// open Caddy's admin endpoint: Caddy refuses a request that carries
// Sec-Fetch-Mode (as every browser request does) without an allowed
// Origin or Referer, as a typed URL has. The state it shows is what
// the admin API shows, Redis credentials never included; serve it only
// where operators reach it (a site bound to 127.0.0.1, or behind
// basic_auth).
type StatusPage struct{}

// CaddyModule returns the Caddy module information.
func (StatusPage) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "http.handlers.fair_queue_status",
		New: func() caddy.Module { return new(StatusPage) },
	}
}

// ServeHTTP answers the page, or with ?format=json the queues' state;
// it never calls next.
func (StatusPage) ServeHTTP(w http.ResponseWriter, r *http.Request, _ caddyhttp.Handler) error {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		w.Header().Set("Allow", "GET, HEAD")
		return caddyhttp.Error(http.StatusMethodNotAllowed, errors.New("fair_queue_status is read-only"))
	}
	h := w.Header()
	h.Set("Cache-Control", "no-store")
	h.Set("X-Content-Type-Options", "nosniff")
	if r.URL.Query().Get("format") == "json" {
		h.Set("Content-Type", "application/json")
		if r.Method == http.MethodHead {
			return nil
		}
		return json.NewEncoder(w).Encode(queueStatus(r.Context()))
	}
	h.Set("Content-Type", "text/html; charset=utf-8")
	h.Set("Content-Security-Policy", statusCSP)
	h.Set("Referrer-Policy", "no-referrer")
	if r.Method == http.MethodHead {
		return nil
	}
	_, err := w.Write(statusHTML)
	return err
}

// Interface guards
var (
	_ caddyhttp.MiddlewareHandler = StatusPage{}
	_ caddyfile.Unmarshaler       = (*StatusPage)(nil)
)
