package caddyfairqueue

import (
	"fmt"
	"testing"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// holderOf loads routes (the JSON of a server's routes) in this process
// and returns the fair_queue handler of queue name in them, as its
// engine holds it from its provisioning.
func holderOf(t *testing.T, name, routes string) *Handler {
	t.Helper()
	cfg := fmt.Sprintf(`{"admin":{"disabled":true},"logging":{"logs":{"default":{"level":"ERROR"}}},
	"apps":{"http":{"servers":{"s":{"listen":["127.0.0.1:%d"],"routes":%s}}}}}`, freePort(t), routes)
	require.NoError(t, caddy.Load([]byte(cfg), false))
	t.Cleanup(func() { _ = caddy.Stop() })
	for _, e := range openEngines() {
		if e.name == name {
			if h := e.appliers.newestHolder(); h != nil {
				return h
			}
		}
	}
	t.Fatalf("no handler holds queue %q", name)
	return nil
}

// chainIDs names the modules of h's chain, or "unknown".
func chainIDs(h *Handler) []string {
	chain, ok := chainAfter(h)
	if !ok {
		return []string{"unknown"}
	}
	var ids []string
	for _, x := range chain {
		ids = append(ids, string(x.(caddy.Module).CaddyModule().ID))
	}
	return ids
}

// What follows a fair_queue handler up to reverse_proxy is read from its
// server's routes, as the Caddyfile lays them out (each directive in a
// route of its own in the site's subroute); where a matcher, a group, a
// subroute on the way or a terminal route make it a matter of the
// request, it is unknown.
func TestTheChainAfterAHandlerIsReadFromItsServersRoutes(t *testing.T) {
	const fq = `{"handler":"fair_queue","name":"chain","permits":1}`
	const rp = `{"handler":"reverse_proxy","upstreams":[{"dial":"127.0.0.1:9"}]}`
	const hdr = `{"handler":"headers","request":{"set":{"X-A":["1"]}}}`
	for _, tc := range []struct {
		name, routes string
		want         []string
	}{
		{"one route", `[{"handle":[` + fq + `,` + rp + `]}]`, []string{"http.handlers.reverse_proxy"}},
		{"a handler between", `[{"handle":[` + fq + `,` + hdr + `,` + rp + `]}]`,
			[]string{"http.handlers.headers", "http.handlers.reverse_proxy"}},
		{"as the Caddyfile lays it out", `[{"match":[{"host":["a.example"]}],"handle":[{"handler":"subroute","routes":[
			{"handle":[` + fq + `]},{"handle":[` + rp + `]}]}],"terminal":true}]`, []string{"http.handlers.reverse_proxy"}},
		{"after the subroute", `[{"handle":[{"handler":"subroute","routes":[{"handle":[` + fq + `]}]},` + rp + `]}]`,
			[]string{"http.handlers.reverse_proxy"}},
		{"a route with a matcher on the way", `[{"handle":[` + fq + `]},{"match":[{"path":["/a"]}],"handle":[` + rp + `]},
			{"handle":[` + rp + `]}]`, []string{"unknown"}},
		{"a group on the way", `[{"handle":[` + fq + `]},{"group":"g","handle":[` + rp + `]}]`, []string{"unknown"}},
		{"a subroute on the way", `[{"handle":[` + fq + `,{"handler":"subroute","routes":[{"handle":[` + rp + `]}]}]}]`,
			[]string{"unknown"}},
		{"a terminal route before reverse_proxy", `[{"handle":[` + fq + `],"terminal":true},{"handle":[` + rp + `]}]`,
			[]string{"unknown"}},
		{"no reverse_proxy", `[{"handle":[` + fq + `,{"handler":"static_response","body":"x"}]}]`, []string{"unknown"}},
		// A named route's contents are not in the invoke's config, and
		// it may proxy the request itself.
		{"an invoke of a named route on the way", `[{"handle":[` + fq + `,{"handler":"invoke","name":"r"},` + rp + `]}],
			"named_routes":{"r":{"handle":[` + rp + `]}}`, []string{"unknown"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.want, chainIDs(holderOf(t, "chain", tc.routes)))
		})
	}
}

// Two chains are alike when their modules and their configs are:
// reverse_proxy to the same static upstreams. A dynamic upstream
// source's config is gone once it is loaded, so such a chain is never
// alike.
func TestChainsAreAlikeByTheirModulesConfigs(t *testing.T) {
	chainOf := func(routes string) []caddyhttp.MiddlewareHandler {
		t.Helper()
		chain, ok := chainAfter(holderOf(t, "alike", routes))
		require.True(t, ok)
		return chain
	}
	site := func(handlers string) string {
		return `[{"handle":[{"handler":"fair_queue","name":"alike","permits":1},` + handlers + `]}]`
	}
	a := chainOf(site(`{"handler":"reverse_proxy","upstreams":[{"dial":"127.0.0.1:9"}]}`))
	same := chainOf(site(`{"handler":"reverse_proxy","upstreams":[{"dial":"127.0.0.1:9"}]}`))
	other := chainOf(site(`{"handler":"reverse_proxy","upstreams":[{"dial":"127.0.0.1:10"}]}`))
	between := chainOf(site(`{"handler":"headers","request":{"set":{"X-A":["1"]}}},
		{"handler":"reverse_proxy","upstreams":[{"dial":"127.0.0.1:9"}]}`))
	dynamic := chainOf(site(`{"handler":"reverse_proxy","dynamic_upstreams":{"source":"a","name":"llm.internal","port":"9"}}`))
	placeholder := chainOf(site(`{"handler":"reverse_proxy","upstreams":[{"dial":"127.0.0.1:9"},{"dial":"{http.vars.upstream}"}]}`))

	assert.True(t, sameChain(a, same), "the same upstream")
	assert.False(t, sameChain(a, other), "another upstream")
	assert.False(t, sameChain(a, between), "a handler between")
	assert.False(t, sameChain(dynamic, dynamic), "a dynamic upstream source")
	// A placeholder in an upstream's address is resolved per request,
	// from what handlers before fair_queue (vars, map) set: the same
	// text may send the old config's requests elsewhere.
	assert.False(t, sameChain(placeholder, placeholder), "an upstream address read from a placeholder")
	// A handler's loaded modules are gone from its JSON: intercept's
	// routes may proxy the request elsewhere.
	intercept := func(dial string) []caddyhttp.MiddlewareHandler {
		return chainOf(site(`{"handler":"intercept","handle_response":[{"match":{"status_code":[404]},
			"routes":[{"handle":[{"handler":"reverse_proxy","upstreams":[{"dial":"` + dial + `"}]}]}]}]},
			{"handler":"reverse_proxy","upstreams":[{"dial":"127.0.0.1:9"}]}`))
	}
	assert.False(t, sameChain(intercept("127.0.0.1:10"), intercept("127.0.0.1:11")), "intercept's routes")
	encode := func(level string) []caddyhttp.MiddlewareHandler {
		return chainOf(site(`{"handler":"encode","encodings":{"gzip":{"level":` + level + `}}},
			{"handler":"reverse_proxy","upstreams":[{"dial":"127.0.0.1:9"}]}`))
	}
	assert.False(t, sameChain(encode("1"), encode("9")), "a handler's loaded modules")
}
