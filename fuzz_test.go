package caddyfairqueue

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
	"github.com/fair-queue/caddy-fair-queue/internal/jsonscan"
)

// Fuzz targets of the parts that read operator or client input. Their
// seeds (f.Add below and testdata/fuzz/<target>/) run in every go test;
// explore further with, for example:
//
//	go test -run '^$' -fuzz '^FuzzUnmarshalCaddyfile$' -fuzztime 5m .
//
// FuzzSniffBody (body_test.go) checks the body sniffing against
// encoding/json; its seeds of malformed JSON are in
// testdata/fuzz/FuzzSniffBody/.

// FuzzUnmarshalCaddyfile feeds arbitrary Caddyfile text to the
// directive's parser. It must never panic; errors are fine. What it
// accepts must be a config that Provision accepts too (defaults applied,
// validation passed, reject policies compiled) and that survives a JSON
// round trip unchanged, since the JSON is what Caddy runs.
func FuzzUnmarshalCaddyfile(f *testing.F) {
	for _, s := range []string{
		"fair_queue {\n\tpermits 4\n}",
		"fair_queue {\n\tname {http.fair_queue.model}\n\tpermits 8\n\tmax_wait 45s\n\tpoll_interval 100ms\n\tmax_body 1MiB\n\tlease 1m\n}",
		"fair_queue {\n\tpermits 2\n\tredis redis://:pw@127.0.0.1:6379/1 {\n\t\tkey_prefix app\n\t}\n\ton_store_error local\n\tlocal_permits 1\n}",
		"fair_queue {\n\tpermits 2\n\tredis {\n\t\tmode sentinel\n\t\tmaster_name m\n\t\taddress a:1 b:2\n\t\tsentinel_password x\n\t}\n}",
		"fair_queue {\n\tpermits 3\n\ttenant {http.request.header.Authorization}\n\tweight gold 2\n\tweight basic 0.5\n\tcost max_tokens 4096\n\tpriority {http.request.header.X-Priority}\n\tpriority_factor 4\n\tmax_queue 100\n\tmax_queue_per_tenant 10\n}",
		"fair_queue {\n\tpermits 1\n\treject timeout {\n\t\tstatus 503\n\t\tretry_after 10s\n\t\tbody `{\"error\":\"{http.fair_queue.reason}\"}`\n\t\tsse_event busy\n\t\tsse_data <<JSON\n\t\t\t{\"a\": 1}\n\t\t\tJSON\n\t}\n}",
		"fair_queue {\n\tpermits 1\n\tpermits 2\n}",
		"fair_queue extra {\n}",
		"fair_queue {\n\tpermits 1\n\tpoll_interval 2s\n\tmax_wait 1s\n}",
		"fair_queue {\n\tpermits 1\n\tredis {\n\t\tmode cluster\n\t\tdb 1\n\t\taddress a:1\n\t}\n}",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, input string) {
		tokens, err := caddyfile.Tokenize([]byte(input), "Caddyfile")
		if err != nil {
			return // not Caddyfile syntax: the lexer's business, not ours
		}
		h := new(Handler)
		if err := h.UnmarshalCaddyfile(caddyfile.NewDispenser(tokens)); err != nil {
			return
		}
		require.GreaterOrEqual(t, h.Permits, 1, "accepted without permits: %q", input)

		first, err := json.Marshal(h)
		require.NoError(t, err, "accepted config does not marshal: %q", input)
		again := new(Handler)
		require.NoError(t, json.Unmarshal(first, again), "JSON %s", first)
		second, err := json.Marshal(again)
		require.NoError(t, err)
		require.JSONEq(t, string(first), string(second), "the JSON round trip changed the config of %q", input)

		again.setDefaults()
		require.NoError(t, again.validate(), "the parser accepted what Provision refuses: %q", input)
		_, err = compileRejects(again.Reject)
		require.NoError(t, err, "the parser accepted rejects that do not compile: %q", input)
		if again.Redis != nil {
			require.NoError(t, again.Redis.check(), "the parser accepted a redis block that Provision refuses: %q", input)
		}
	})
}

// rejectValues are the placeholders a reject template may use; the
// fuzzed value stands for client input (the model, a header) in each.
var rejectValues = []string{phModel, phQueue, "http.request.header.X-Fuzz"}

// fuzzReplacer is a request's replacer: Caddy's global placeholders
// ({env.*}, {time.*}...) and every rejectValues placeholder set to value.
func fuzzReplacer(value string) *caddy.Replacer {
	repl := caddy.NewReplacer()
	for _, k := range rejectValues {
		repl.Set(k, value)
	}
	return repl
}

// renderFuzzReject renders the reject of reason timeout with the body
// (and SSE data) template tmpl, every rejectValues placeholder set to
// value.
func renderFuzzReject(t *testing.T, tmpl, value string, streaming bool) string {
	t.Helper()
	policies, err := compileRejects([]*RejectConfig{{Body: tmpl, SSEData: tmpl}})
	require.NoError(t, err)
	repl := fuzzReplacer(value)
	rej := &fairqueue.RejectError{Reason: fairqueue.ReasonTimeout, Waited: time.Second, Position: 3, RetryAfter: 2 * time.Second}
	w := httptest.NewRecorder()
	require.NoError(t, policies[rej.Reason].write(w, repl, rej, streaming, apiOpenAI))
	return w.Body.String()
}

// FuzzRejectTemplate renders reject templates with arbitrary
// placeholder values (client input) and arbitrary templates (operator
// input). Values are JSON-escaped in strings, a JSON scalar or null
// outside them: a template that is valid JSON stays valid JSON whatever
// the values, a value placed in a JSON string reads back as itself, a
// value outside strings adds no structure, and no value can add a line
// to an SSE answer (which would let it forge events).
func FuzzRejectTemplate(f *testing.F) {
	for _, s := range [][2]string{
		{`{"error":{"message":"{http.fair_queue.message}","code":"{http.fair_queue.reason}","model":"{http.fair_queue.model}"}}`, `gpt-4o`},
		{`{"retry":{http.fair_queue.retry_after},"q":"{http.fair_queue.queue}"}`, "evil\"}\n<model>"},
		{"line one\nline two {http.fair_queue.model}", "\r\n\r\nevent: forged\ndata: x"},
		{`{"m":"{http.fair_queue.model}","keep":"{unknown.placeholder}"}`, "\u2028\u2029\x00\x1f\\"},
		{`["{http.request.header.X-Fuzz}", "{http.fair_queue.wait_ms}", {"p": "{http.fair_queue.position}"}]`, "{http.fair_queue.reason}"},
		{`{"a":"{http.fair_queue.model}{http.fair_queue.queue}"}`, "\xff\xfe"},
		{`{}`, ""},
		{`{"a":"x\\}","b":"\\{http.fair_queue.model}"}`, "v"},     // backslashes before braces
		{`{"{env.":1,"a":"}","{http.fair_queue.model":"}"}`, "v"}, // braces in different strings
	} {
		f.Add(s[0], s[1])
	}
	f.Fuzz(func(t *testing.T, tmpl, value string) {
		// A value in a JSON string reads back as itself (as encoding/json
		// reads it: invalid UTF-8 becomes U+FFFD).
		var want string
		b, _ := json.Marshal(value)
		require.NoError(t, json.Unmarshal(b, &want))
		var got struct{ M, Q, H string }
		out := renderFuzzReject(t, `{"M":"{http.fair_queue.model}","Q":"<{http.fair_queue.queue}>","H":"{http.request.header.X-Fuzz}"}`, value, false)
		require.NoError(t, json.Unmarshal([]byte(out), &got), "output %q", out)
		assert.Equal(t, want, got.M)
		assert.Equal(t, "<"+want+">", got.Q)
		assert.Equal(t, want, got.H)

		// Outside a string, a value is a JSON scalar or null: it can add
		// no structure to a valid template.
		var num map[string]any
		out = renderFuzzReject(t, `{"n":{http.fair_queue.model},"a":[{http.request.header.X-Fuzz}]}`, value, false)
		require.NoError(t, json.Unmarshal([]byte(out), &num), "output %q", out)
		assert.Len(t, num, 2, "output %q", out)
		assert.Len(t, num["a"], 1, "output %q", out)

		body := renderFuzzReject(t, tmpl, value, false)
		if json.Valid([]byte(tmpl)) {
			assert.True(t, json.Valid([]byte(body)), "valid JSON template %q gave invalid JSON %q for value %q", tmpl, body, value)
		}

		// SSE: one event, its lines set by the template alone.
		sse := renderFuzzReject(t, tmpl, value, true)
		plain := renderFuzzReject(t, tmpl, "", true)
		require.True(t, strings.HasPrefix(sse, "event: error\n"), "%q", sse)
		require.True(t, strings.HasSuffix(sse, "\n\n"), "%q", sse)
		assert.Equal(t, strings.Count(plain, "\n"), strings.Count(sse, "\n"), "value %q changed the lines of the event: %q", value, sse)
		assert.Equal(t, strings.Count(plain, "\r"), strings.Count(sse, "\r"), "value %q added a CR to the event: %q", value, sse)
		for line := range strings.SplitSeq(strings.TrimSuffix(sse, "\n\n"), "\n") {
			require.True(t, strings.HasPrefix(line, "event: ") || strings.HasPrefix(line, "data: "), "line %q of %q", line, sse)
		}
	})
}

// FuzzTenantNormalisation resolves arbitrary tenant values (an API key
// header, client input) the way the handler does: the value is cut at
// 1 KiB and only its key, 16 hex digits, reaches the store and the
// {http.fair_queue.tenant} placeholder; values sharing their first KiB
// are one tenant.
func FuzzTenantNormalisation(f *testing.F) {
	for _, s := range []string{"", "Bearer sk-secret", "a:b:c", "x.y.z", "{http.request.host}", strings.Repeat("k", maxTenantLen+7), "\xff\x00\n"} {
		f.Add(s)
	}
	hex16 := regexp.MustCompile(`^[0-9a-f]{16}$`)
	h := &Handler{Tenant: "{fuzz.tenant}", Weights: map[string]float64{"gold": 3}}
	f.Fuzz(func(t *testing.T, v string) {
		repl := caddy.NewReplacer()
		repl.Set("fuzz.tenant", v)
		req := h.fairRequest(repl, jsonscan.Fields{})
		key, _ := repl.GetString(phTenant)
		require.Regexp(t, hex16, key)
		assert.Equal(t, fairqueue.TenantKey(req.Tenant), key)
		assert.LessOrEqual(t, len(req.Tenant), maxTenantLen)
		assert.True(t, strings.HasPrefix(v, req.Tenant), "tenant value %q is not a prefix of %q", req.Tenant, v)
		if v == "gold" {
			assert.Equal(t, 3.0, req.Weight)
		}
		if len(v) >= maxTenantLen {
			longer := caddy.NewReplacer()
			longer.Set("fuzz.tenant", v+"-more")
			h.fairRequest(longer, jsonscan.Fields{})
			other, _ := longer.GetString(phTenant)
			assert.Equal(t, key, other, "values sharing their first KiB are one tenant")
		}
	})
}

// A request whose model holds invalid UTF-8 reaches a handler that
// names its queue after the model. The name is a metric label, which
// must be valid UTF-8: the handler must answer this request and keep
// serving others.
//
// Known bug, skipped until fixed: sniffBody returns the model's raw
// bytes (encoding/json would give U+FFFD), the metrics panic on the
// label ("label queue: value ... is not valid UTF-8") inside newEngine,
// called by Handler.use with h.mu held, so h.mu stays locked and every
// later request of the handler hangs. Fix: give the name valid UTF-8
// (unquote the model as encoding/json does, and strings.ToValidUTF8 the
// resolved name in ServeHTTP), and never hold h.mu across a call that can
// panic (defer the unlock).
func TestInvalidUTF8ModelNeitherPanicsNorWedgesTheHandler(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	h := provisionLocal(t, newContext(t), &Handler{Name: "llm-{http.fair_queue.model}", Permits: 1})
	bad := newRequest(context.Background(), "{\"model\":\"\xff\"}").start(h, okHandler).wait(t)
	require.NoError(t, bad.err)
	ok := newRequest(context.Background(), `{"model":"ok"}`).start(h, okHandler).wait(t)
	require.NoError(t, ok.err)
	assert.Equal(t, 200, ok.w.Code)
	assert.True(t, bytes.Equal([]byte("llm-ok"), []byte(ok.placeholder(phQueue))))
}
