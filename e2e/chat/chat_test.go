//go:build e2e

// Package chat tests the chat page (web/chat.html) in headless Chromium,
// served as make run serves it: by Caddy with Caddyfile.example, whose
// ports, upstream and max_wait the tests change and nothing else.
package chat

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/e2e/browser"
	"github.com/fair-queue/caddy-fair-queue/internal/harness"
	"github.com/fair-queue/caddy-fair-queue/internal/mockllm"
)

const (
	// permits is the permits of Caddyfile.example.
	permits = 4
	// queueName is the name of its queue.
	queueName = "llm"
	// maxWait replaces the example's 20s where a test waits for the
	// timeout: long enough to see the page queued, short enough to wait
	// for it.
	maxWait = 5 * time.Second
	// tokens and tokenDelay shape the mock's answer: slow enough to see
	// the answer grow.
	tokens     = 6
	tokenDelay = 250 * time.Millisecond
)

func TestMain(m *testing.M) { os.Exit(harness.Main(m)) }

// site runs Caddy with Caddyfile.example, in the repository as make run
// does (its file_server root is relative), on free ports and in front of
// the mock LLM, with a max_wait of wait.
func site(t *testing.T, wait time.Duration) *harness.Caddy {
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
			{"max_wait 20s", "max_wait " + wait.String()},
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

// waitState waits, at most d, until the page's status is in state s.
func waitState(t *testing.T, tab context.Context, s string, d time.Duration) {
	t.Helper()
	browser.Do(t, tab, d, chromedp.WaitVisible(chromedp.CSS(fmt.Sprintf(`#status[data-state=%q]`, s))))
}

// openAndSend loads the page and sends one message.
func openAndSend(t *testing.T, tab context.Context, base string) {
	t.Helper()
	browser.Do(t, tab, 30*time.Second, chromedp.Navigate(base+"/"))
	waitState(t, tab, "idle", 10*time.Second)
	browser.Do(t, tab, 10*time.Second,
		chromedp.SetValue(chromedp.CSS("#prompt"), "Hello, queue."),
		chromedp.Click(chromedp.CSS("#send")),
	)
}

func TestChatPageShowsItsPlaceInTheQueueThenStreamsTheAnswer(t *testing.T) {
	// The example's own max_wait: on a loaded machine, loading the page
	// and its screenshot may take longer than maxWait, and the waiters
	// must still be there when the holders release.
	c := site(t, 20*time.Second)
	// The browser starts before the queue fills: on a loaded machine its
	// start alone can outlast the waiters' max_wait.
	tab := browser.Start(t)
	holders := fillQueue(t, c, 2)
	openAndSend(t, tab, c.URL())

	waitState(t, tab, "queued", 15*time.Second)
	queued := browser.Text(t, tab, "#status")
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
	partial := browser.Text(t, tab, ".msg.assistant")
	assert.Less(t, len(strings.Fields(partial)), tokens, "the answer is shown before it is whole: %q", partial)

	waitState(t, tab, "served", 20*time.Second)
	served, answer := browser.Text(t, tab, "#status"), browser.Text(t, tab, ".msg.assistant")
	chunks := browser.Get(t, tab, 10*time.Second, chromedp.AttributeValue(chromedp.CSS(".msg.assistant"), "data-chunks"))
	assert.Equal(t, strings.Repeat("tok ", tokens), answer, "every token, in order")
	assert.Equal(t, fmt.Sprint(tokens), chunks.Value, "one update per token")
	assert.Contains(t, served, fmt.Sprintf("Served: %d tokens", tokens))
}

func TestChatPageShowsTheBusyMessageWhenItsWaitTimesOut(t *testing.T) {
	c := site(t, maxWait)
	tab := browser.Start(t)
	fillQueue(t, c, 0)
	openAndSend(t, tab, c.URL())

	waitState(t, tab, "queued", 15*time.Second)
	assert.Contains(t, browser.Text(t, tab, "#status"), "position 1")

	waitState(t, tab, "rejected", maxWait+15*time.Second)
	rejected, message := browser.Text(t, tab, "#status"), browser.Text(t, tab, ".msg.assistant.rejected")
	assert.Regexp(t, `^The server is busy: the request waited 5(\.\d)?s in the queue without being served\. Please retry after \d+ seconds?\.$`, message)
	assert.Equal(t, "Turned away (timeout).", rejected)
}

// screenshot returns a PNG of the tab's viewport.
func screenshot(t *testing.T, tab context.Context) []byte {
	t.Helper()
	return browser.Get(t, tab, 15*time.Second, chromedp.CaptureScreenshot())
}
