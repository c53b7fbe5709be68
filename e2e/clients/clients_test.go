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
}

// caddyfile serves /<library>/<queue>/* from its own queue in front of
// upstream.
func caddyfile(httpPort, adminPort int, upstream string) string {
	var b strings.Builder
	fmt.Fprintf(&b, `{
	admin 127.0.0.1:%d
	auto_https off
	persist_config off
	grace_period 1s
}

:%d {
`, adminPort, httpPort)
	for _, lib := range libraries {
		for name, opts := range queues {
			fmt.Fprintf(&b, `	handle_path /%[1]s/%[2]s/* {
		fair_queue {
			name %[1]s-%[2]s
			permits 1
			%[3]s
		}
		reverse_proxy %[4]s {
			flush_interval -1
		}
	}
`, lib, name, opts, upstream)
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
	c := harness.StartCaddyfile(t, "caddy", func(p harness.Ports) string {
		return caddyfile(p.HTTP, p.Admin, upstream)
	}, harness.CaddyOptions{})

	out := command(t, 5*time.Minute, []string{"FAIR_QUEUE_URL=" + c.URL()},
		"node", "--test", "--test-reporter=spec", "--test-concurrency=2", "openai.test.mjs", "ai-sdk.test.mjs", "ollama.test.mjs")
	t.Logf("node --test:\n%s", out)
}
