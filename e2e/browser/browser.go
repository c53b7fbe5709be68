//go:build e2e

// Package browser drives headless Chromium for the browser tests of the
// pages fair_queue serves (e2e/chat, e2e/status): one browser with a
// fresh profile per test, kept off the network, and the few helpers the
// tests share.
package browser

import (
	"context"
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/require"
)

// Path returns the browser's path: $CHROMIUM, else chromium in PATH
// (scripts/ensure-chromium.sh installs Debian's).
func Path(t testing.TB) string {
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

// Start starts headless Chromium with a fresh profile and returns a
// tab's context; both end with the test. Besides chromedp's defaults
// (headless, no background networking, sync or extensions), the flags
// keep it off the network (no QUIC, no component updates) and let it run
// as root.
func Start(t testing.TB) context.Context {
	t.Helper()
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(Path(t)),
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

// Do runs steps in the tab, bounded by d.
func Do(t testing.TB, tab context.Context, d time.Duration, steps ...chromedp.Action[chromedp.Void]) {
	t.Helper()
	ctx, cancel := context.WithTimeout(tab, d)
	defer cancel()
	require.NoError(t, chromedp.Do(ctx, steps...))
}

// Get runs a in the tab, bounded by d, and returns its value.
func Get[T any](t testing.TB, tab context.Context, d time.Duration, a chromedp.Action[T]) T {
	t.Helper()
	ctx, cancel := context.WithTimeout(tab, d)
	defer cancel()
	v, err := chromedp.Run(ctx, a)
	require.NoError(t, err)
	return v
}

// Text returns the text of the first element matching the CSS selector.
func Text(t testing.TB, tab context.Context, sel string) string {
	t.Helper()
	return Get(t, tab, 10*time.Second, chromedp.Text(chromedp.CSS(sel)))
}
