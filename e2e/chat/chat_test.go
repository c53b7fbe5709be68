//go:build e2e

// Package chat tests the chat page (web/chat.html) in headless Chromium,
// served as make run serves it: by Caddy with Caddyfile.example, whose
// ports, upstream and max_wait the tests change and nothing else.
package chat

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/internal/harness"
	"github.com/fair-queue/caddy-fair-queue/internal/mockllm"
)

const (
	// permits is the permits of Caddyfile.example.
	permits = 4
	// queueName is the name of its queue.
	queueName = "llm"
	// maxWait replaces the example's 20s: long enough to see the page
	// queued, short enough to wait for its timeout.
	maxWait = 5 * time.Second
	// tokens and tokenDelay shape the mock's answer: slow enough to see
	// the answer grow.
	tokens     = 6
	tokenDelay = 250 * time.Millisecond
)

func TestMain(m *testing.M) { os.Exit(harness.Main(m)) }

// site runs Caddy with Caddyfile.example, in the repository as make run
// does (its file_server root is relative), on free ports and in front of
// the mock LLM.
func site(t *testing.T) *harness.Caddy {
	t.Helper()
	root := harness.ModuleRoot(t)
	raw, err := os.ReadFile(filepath.Join(root, "Caddyfile.example"))
	require.NoError(t, err)
	_, upstream := harness.StartMockLLM(t, mockllm.Config{Tokens: tokens, Delay: tokenDelay})
	example := string(raw)
	// What the tests rely on, kept as it is.
	for _, s := range []string{fmt.Sprintf("permits %d", permits), "name " + queueName, "sse_keepalive 1s", "handle / {"} {
		require.Contains(t, example, s, "Caddyfile.example changed: update the chat tests")
	}
	return harness.StartCaddyfile(t, "caddy", func(p harness.Ports) string {
		cfg := example
		for _, r := range []struct{ old, new string }{
			{"admin localhost:2019", fmt.Sprintf("admin 127.0.0.1:%d", p.Admin)},
			{":8080 {", fmt.Sprintf(":%d {", p.HTTP)},
			{"127.0.0.1:8081", upstream},
			{"max_wait 20s", "max_wait " + maxWait.String()},
			{"grace_period 30s", "grace_period 1s"},
		} {
			require.Contains(t, cfg, r.old, "Caddyfile.example changed: update the chat tests")
			cfg = strings.ReplaceAll(cfg, r.old, r.new)
		}
		return cfg
	}, harness.CaddyOptions{Dir: root})
}

// fillQueue holds every permit of the example's queue and puts waiters
// more requests in line behind them; it returns the holders.
func fillQueue(t *testing.T, c *harness.Caddy, waiters int) []*harness.Stream {
	t.Helper()
	url := c.URL() + "/v1/chat/completions"
	var holders []*harness.Stream
	for range permits {
		holders = append(holders, harness.StartStream(t, url))
	}
	c.WaitQueue(queueName, 0, permits, 10*time.Second)
	for range waiters {
		harness.StartStream(t, url)
	}
	c.WaitQueue(queueName, waiters, permits, 10*time.Second)
	return holders
}

// chromium returns the browser's path: $CHROMIUM, else chromium in PATH
// (scripts/ensure-chromium.sh installs Debian's).
func chromium(t *testing.T) string {
	t.Helper()
	if p := os.Getenv("CHROMIUM"); p != "" {
		return p
	}
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	t.Fatal("no chromium in PATH: run scripts/ensure-chromium.sh (make e2e does), or set CHROMIUM")
	return ""
}

// browser starts headless Chromium with a fresh profile and returns a
// tab's context; both end with the test. Besides chromedp's defaults
// (headless, no background networking, sync or extensions), the flags
// keep it off the network (no QUIC, no component updates) and let it run
// as root.
func browser(t *testing.T) context.Context {
	t.Helper()
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(chromium(t)),
		chromedp.UserDataDir(t.TempDir()),
		chromedp.NoSandbox,
		chromedp.DisableGPU,
		chromedp.Flag("disable-quic", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.WindowSize(820, 520),
	)
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	tab, cancelTab := chromedp.NewContext(actx, chromedp.WithLogf(t.Logf))
	t.Cleanup(func() {
		cancelTab()
		cancelAlloc()
	})
	// The first run starts the browser, which lives as long as the
	// context of that run: no timeout on it.
	require.NoError(t, chromedp.Do(tab), "start chromium")
	return tab
}

// do runs steps in the tab, bounded by d.
func do(t *testing.T, tab context.Context, d time.Duration, steps ...chromedp.Action[chromedp.Void]) {
	t.Helper()
	ctx, cancel := context.WithTimeout(tab, d)
	defer cancel()
	require.NoError(t, chromedp.Do(ctx, steps...))
}

// get runs a in the tab, bounded by d, and returns its value.
func get[T any](t *testing.T, tab context.Context, d time.Duration, a chromedp.Action[T]) T {
	t.Helper()
	ctx, cancel := context.WithTimeout(tab, d)
	defer cancel()
	v, err := chromedp.Run(ctx, a)
	require.NoError(t, err)
	return v
}

// text returns the text of the first element matching the CSS selector.
func text(t *testing.T, tab context.Context, sel string) string {
	t.Helper()
	return get(t, tab, 10*time.Second, chromedp.Text(chromedp.CSS(sel)))
}

// waitState waits, at most d, until the page's status is in state s.
func waitState(t *testing.T, tab context.Context, s string, d time.Duration) {
	t.Helper()
	do(t, tab, d, chromedp.WaitVisible(chromedp.CSS(fmt.Sprintf(`#status[data-state=%q]`, s))))
}

// openAndSend loads the page and sends one message.
func openAndSend(t *testing.T, tab context.Context, base string) {
	t.Helper()
	do(t, tab, 30*time.Second, chromedp.Navigate(base+"/"))
	waitState(t, tab, "idle", 10*time.Second)
	do(t, tab, 10*time.Second,
		chromedp.SetValue(chromedp.CSS("#prompt"), "Hello, queue."),
		chromedp.Click(chromedp.CSS("#send")),
	)
}

func TestChatPageShowsItsPlaceInTheQueueThenStreamsTheAnswer(t *testing.T) {
	c := site(t)
	// The browser starts before the queue fills: on a loaded machine its
	// start alone can outlast the waiters' max_wait.
	tab := browser(t)
	holders := fillQueue(t, c, 2)
	openAndSend(t, tab, c.URL())

	waitState(t, tab, "queued", 15*time.Second)
	queued := text(t, tab, "#status")
	assert.Regexp(t, `^Waiting in the queue: position 3 · (about \d+ s left · )?waited \d+ s$`, queued,
		"two waiters ahead of the page's request")

	png := screenshot(t, tab)
	assert.Greater(t, len(png), 1000, "a PNG of the page")
	if dst := os.Getenv("CHAT_SCREENSHOT"); dst != "" {
		if !filepath.IsAbs(dst) {
			dst = filepath.Join(harness.ModuleRoot(t), dst)
		}
		require.NoError(t, os.WriteFile(dst, png, 0o644))
		t.Logf("wrote %s", dst)
	}

	for _, h := range holders {
		h.Release()
	}
	// Tokens arrive one every 250ms: the page shows the answer growing.
	waitState(t, tab, "streaming", 20*time.Second)
	partial := text(t, tab, ".msg.assistant")
	assert.Less(t, len(strings.Fields(partial)), tokens, "the answer is shown before it is whole: %q", partial)

	waitState(t, tab, "served", 20*time.Second)
	served, answer := text(t, tab, "#status"), text(t, tab, ".msg.assistant")
	chunks := get(t, tab, 10*time.Second, chromedp.AttributeValue(chromedp.CSS(".msg.assistant"), "data-chunks"))
	assert.Equal(t, strings.Repeat("tok ", tokens), answer, "every token, in order")
	assert.Equal(t, fmt.Sprint(tokens), chunks.Value, "one update per token")
	assert.Contains(t, served, fmt.Sprintf("Served: %d tokens", tokens))
}

func TestChatPageShowsTheBusyMessageWhenItsWaitTimesOut(t *testing.T) {
	c := site(t)
	tab := browser(t)
	fillQueue(t, c, 0)
	openAndSend(t, tab, c.URL())

	waitState(t, tab, "queued", 15*time.Second)
	assert.Contains(t, text(t, tab, "#status"), "position 1")

	waitState(t, tab, "rejected", maxWait+15*time.Second)
	rejected, message := text(t, tab, "#status"), text(t, tab, ".msg.assistant.rejected")
	assert.Regexp(t, `^The server is busy: the request waited 5(\.\d)?s in the queue without being served\. Please retry after \d+ seconds?\.$`, message)
	assert.Equal(t, "Turned away (timeout).", rejected)
}

// screenshot returns a PNG of the tab's viewport.
func screenshot(t *testing.T, tab context.Context) []byte {
	t.Helper()
	return get(t, tab, 15*time.Second, chromedp.CaptureScreenshot())
}
