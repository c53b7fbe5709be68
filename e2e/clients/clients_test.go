//go:build e2e

// Package clients runs real client libraries, from npm, against
// fair_queue in front of the mock LLM: the OpenAI Node SDK (openai) and
// the Vercel AI SDK (ai with @ai-sdk/openai-compatible). The tests are
// node:test files beside this one (*.test.mjs); this Go test installs
// their packages with npm ci from the committed package-lock.json, starts
// Caddy and the mock, and runs node --test.
package clients

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/fair-queue/caddy-fair-queue/internal/harness"
	"github.com/fair-queue/caddy-fair-queue/internal/mockllm"
)

func TestMain(m *testing.M) { os.Exit(harness.Main(m)) }

// libraries each get queues of their own, so that their test files run
// at once.
var libraries = []string{"openai", "ai", "ollama"}

// queues are the queues of each library, one permit each; lib.mjs says
// what each is for.
var queues = map[string]string{
	"timeout": `max_wait 1s
			reject timeout {
				retry_after 3s
			}`,
	"keepalive": `max_wait 3s
			sse_keepalive 200ms`,
	"events": `max_wait 3s
			sse_keepalive 200ms
			sse_queue_events`,
	"sse429": `max_wait 1s
			reject timeout {
				retry_after 1s
				sse_status 429
			}`,
	"retry60": `max_wait 1s
			reject timeout {
				retry_after 60s
			}`,
	"nostore": `max_wait 1s
			redis redis://127.0.0.1:1
			on_store_error fail_closed`,
	"redirect": `max_wait 3s
			sse_keepalive 200ms`,
}

// redirected are the queues whose upstream answers every request with a
// redirect (redirector); /<library>/<queue>-hold/* is the same queue in
// front of the mock, for the request that holds its permit.
var redirected = map[string]bool{"redirect": true}

// caddyfile serves /<library>/<queue>/* from its own queue in front of
// upstream (redirector for the redirected queues).
func caddyfile(httpPort, adminPort int, upstream, redirector string) string {
	var b strings.Builder
	fmt.Fprintf(&b, `{
	admin 127.0.0.1:%d
	auto_https off
	persist_config off
	grace_period 1s
}

:%d {
`, adminPort, httpPort)
	route := func(lib, path, name, opts, upstream string) {
		fmt.Fprintf(&b, `	handle_path /%[1]s/%[2]s/* {
		fair_queue {
			name %[1]s-%[3]s
			permits 1
			%[4]s
		}
		reverse_proxy %[5]s {
			flush_interval -1
		}
	}
`, lib, path, name, opts, upstream)
	}
	for _, lib := range libraries {
		for name, opts := range queues {
			if redirected[name] {
				route(lib, name, name, opts, redirector)
				route(lib, name+"-hold", name, opts, upstream)
				continue
			}
			route(lib, name, name, opts, upstream)
		}
	}
	b.WriteString("}\n")
	return b.String()
}

// command runs name in this directory, bounded by d, and fails the test
// with its output if it fails; it returns the output.
func command(t *testing.T, d time.Duration, env []string, name string, args ...string) string {
	t.Helper()
	if _, err := exec.LookPath(name); err != nil {
		t.Fatalf("%s not found in PATH: the client tests need Node.js 20 or later with npm", name)
	}
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Env = append(os.Environ(), env...)
	start := time.Now()
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s: %v (after %v)\n%s", name, strings.Join(args, " "), err, time.Since(start).Round(time.Millisecond), out)
	}
	t.Logf("%s %s: %v", name, strings.Join(args, " "), time.Since(start).Round(time.Millisecond))
	return string(out)
}

func TestClientLibrariesAgainstFairQueue(t *testing.T) {
	// The exact versions of package-lock.json, nothing resolved anew.
	command(t, 5*time.Minute, nil, "npm", "ci", "--no-audit", "--no-fund")

	_, upstream := harness.StartMockLLM(t, mockllm.Config{Tokens: 8, Delay: 10 * time.Millisecond})
	// An http:// upstream that sends its clients to https://.
	redirector := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Location", "https://llm.invalid"+r.URL.Path)
		w.Header().Set("Content-Type", "text/html")
		w.WriteHeader(http.StatusPermanentRedirect)
		_, _ = io.WriteString(w, "<html><body>308 Permanent Redirect</body></html>\n")
	}))
	t.Cleanup(redirector.Close)
	c := harness.StartCaddyfile(t, "caddy", func(p harness.Ports) string {
		return caddyfile(p.HTTP, p.Admin, upstream, strings.TrimPrefix(redirector.URL, "http://"))
	}, harness.CaddyOptions{})

	out := command(t, 5*time.Minute, []string{"FAIR_QUEUE_URL=" + c.URL()},
		"node", "--test", "--test-reporter=spec", "--test-concurrency=2", "openai.test.mjs", "ai-sdk.test.mjs", "ollama.test.mjs")
	t.Logf("node --test:\n%s", out)
}
