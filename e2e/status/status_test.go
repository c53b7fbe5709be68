//go:build e2e

// Package status tests the status page (web/status.html, served by the
// fair_queue_status handler) in headless Chromium: what it renders is
// what the queues hold, and a queue's name is shown as text, whatever
// HTML it contains.
package status

import (
	"context"
	"fmt"
	"os"
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
	// pool is the queue with one upstream of poolPermits permits.
	pool        = "llm"
	poolPermits = 2
	// hostile is a queue whose name is HTML that would run a script, set
	// window.pwned, were it parsed.
	hostile = `<img src=x onerror=window.pwned=1><b>bold</b>&amp;`
	// pagePath is where the site serves the page.
	pagePath = "/fair_queue/status"
)

func TestMain(m *testing.M) { os.Exit(harness.Main(m)) }

// site runs Caddy with the page at pagePath, the queue hostile under
// /hostile/ and the pool queue under /v1/, both in front of the
// mock LLM and with a max_wait that outlasts the test.
func site(t *testing.T) (c *harness.Caddy, upstream string) {
	t.Helper()
	_, upstream = harness.StartMockLLM(t, mockllm.Config{})
	c = harness.StartCaddy(t, "caddy", fmt.Sprintf(`
	handle %s {
		fair_queue_status
	}
	handle_path /hostile/* {
		fair_queue {
			name %q
			permits 1
			max_wait 2m
		}
		reverse_proxy %s {
			flush_interval -1
		}
	}
	handle /v1/* {
		fair_queue {
			name %s
			upstream %s %d
			max_wait 2m
		}
		reverse_proxy {
			dynamic fair_queue
			flush_interval -1
		}
	}`, pagePath, hostile, upstream, pool, upstream, poolPermits), harness.CaddyOptions{})
	return c, upstream
}

// The queue of kvSite: one upstream of kvPermits permits and kvCapacity
// KV-cache tokens; a request without a completion budget is given
// kvBudget. harness.StartStream's request, its prompt 4 bytes of text
// (1 token at the seed of 4 bytes per token), weighs 1 + kvBudget = 100:
// two fit, a third waits.
const (
	kvQueue    = "kv"
	kvPermits  = 4
	kvCapacity = 250
	kvBudget   = 99
)

// kvSite runs Caddy with the page at pagePath and the queue kvQueue under
// /v1/, in front of the mock LLM, with a max_wait that outlasts the test.
func kvSite(t *testing.T) (c *harness.Caddy, upstream string) {
	t.Helper()
	_, upstream = harness.StartMockLLM(t, mockllm.Config{})
	c = harness.StartCaddy(t, "caddy", fmt.Sprintf(`
	handle %s {
		fair_queue_status
	}
	handle /v1/* {
		fair_queue {
			name %s
			upstream %s %d kv_tokens %d
			default_max_tokens %d
			max_wait 2m
		}
		reverse_proxy {
			dynamic fair_queue
			flush_interval -1
		}
	}`, pagePath, kvQueue, upstream, kvPermits, kvCapacity, kvBudget), harness.CaddyOptions{})
	return c, upstream
}

// shown is one queue as the page renders it: the text of its cells.
type shown struct {
	Name            string // the heading's text
	Attr            string // its section's data-queue
	Store           string
	StoreUp         string
	Waiting         string
	ClusterWaiting  string
	InFlight        string
	ClusterInFlight string
	ClusterAge      string
	Nodes           string
	// KVTokens, ClusterKVTokens and PromptEstimate are the queue's
	// tokens rows ("" when not shown); Other whether it lists fields the
	// page does not know.
	KVTokens        string
	ClusterKVTokens string
	PromptEstimate  string
	Other           bool
	Upstreams       []struct{ Dial, InFlight, Permits, KVTokens, State string }
}

// readPage is the page's queues, read from its DOM as text.
const readPage = `[...document.querySelectorAll("section.queue")].map(s => {
	const text = (root, n) => { const e = root.querySelector('[data-field="' + n + '"]'); return e ? e.textContent : ""; };
	const f = n => text(s, n), counts = n => text(s.querySelector("table.counts"), n);
	return {
		name: s.querySelector("h2.name").textContent, attr: s.dataset.queue,
		store: s.querySelector(".store").textContent, storeUp: f("store-up"),
		waiting: f("waiting"), clusterWaiting: f("cluster-waiting"),
		inFlight: f("in-flight"), clusterInFlight: f("cluster-in-flight"),
		clusterAge: f("cluster-age"), nodes: f("nodes"),
		kvTokens: counts("kv-tokens"), clusterKVTokens: counts("cluster-kv-tokens"),
		promptEstimate: counts("prompt-estimate"), other: s.querySelector("dl.more") !== null,
		upstreams: [...s.querySelectorAll("tr.upstream")].map(r => {
			const g = n => text(r, n);
			return { dial: g("dial"), inFlight: g("in-flight"), permits: g("permits"), kvTokens: g("kv-tokens"), state: g("state") };
		}),
	};
})`

// waitShown reads the page until ok accepts what it shows, at most d,
// and returns that; the test fails with the last reading otherwise.
func waitShown(t *testing.T, tab context.Context, d time.Duration, ok func(map[string]shown) bool) map[string]shown {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		list := browser.Get(t, tab, 10*time.Second, chromedp.Evaluate[[]shown](readPage))
		byName := map[string]shown{}
		for _, q := range list {
			byName[q.Name] = q
		}
		if ok(byName) {
			return byName
		}
		if time.Now().After(deadline) {
			t.Fatalf("the page did not show what was expected within %v; it showed %+v", d, list)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func TestStatusPageShowsWaitingAndInFlightPerQueueAndUpstream(t *testing.T) {
	c, upstream := site(t)
	tab := browser.Start(t)
	url := c.URL() + "/v1/chat/completions"
	var holders []*harness.Stream
	for range poolPermits {
		holders = append(holders, harness.StartStream(t, url))
	}
	c.WaitQueue(pool, 0, poolPermits, 10*time.Second)
	for range 3 {
		harness.StartStream(t, url)
	}
	c.WaitQueue(pool, 3, poolPermits, 10*time.Second)
	for range 2 {
		harness.StartStream(t, c.URL()+"/hostile/v1/chat/completions")
	}
	c.WaitQueue(hostile, 1, 1, 10*time.Second)

	browser.Do(t, tab, 30*time.Second, chromedp.Navigate(c.URL()+pagePath))
	browser.Do(t, tab, 10*time.Second, chromedp.WaitVisible(chromedp.CSS(`#status[data-state="ok"]`)))
	got := waitShown(t, tab, 5*time.Second, func(m map[string]shown) bool { return len(m) == 2 })

	q := got[pool]
	assert.Equal(t, pool, q.Attr)
	assert.Contains(t, q.Store, "store: local")
	assert.Contains(t, q.Store, fmt.Sprintf("permits %d", poolPermits))
	assert.Equal(t, "up", q.StoreUp)
	assert.Equal(t, "3", q.Waiting, "waiting on this instance")
	assert.Equal(t, "3", q.ClusterWaiting, "waiting in the whole queue")
	assert.Equal(t, "2", q.InFlight)
	assert.Equal(t, "2 / 2", q.ClusterInFlight)
	assert.Equal(t, "cluster (now)", q.ClusterAge, "read from the store with the page's answer")
	assert.Equal(t, "1", q.Nodes)
	require.Len(t, q.Upstreams, 1)
	assert.Equal(t, upstream, q.Upstreams[0].Dial)
	assert.Equal(t, "2", q.Upstreams[0].InFlight)
	assert.Equal(t, "2", q.Upstreams[0].Permits)
	assert.Equal(t, "in dispatch", q.Upstreams[0].State)
	// Without kv_tokens the page shows no tokens: no row, no column.
	assert.Empty(t, q.KVTokens+q.ClusterKVTokens+q.PromptEstimate+q.Upstreams[0].KVTokens)
	assert.False(t, q.Other, "every field is one the page shows")

	h, ok := got[hostile]
	require.True(t, ok, "the hostile name is shown as its text: %+v", got)
	assert.Equal(t, hostile, h.Attr)
	assert.Equal(t, "1", h.Waiting)
	assert.Equal(t, "1", h.InFlight)
	assert.Zero(t, browser.Get(t, tab, 5*time.Second, chromedp.Evaluate[int](`document.querySelectorAll("main img, main b").length`)),
		"no element made of a queue's name")
	assert.True(t, browser.Get(t, tab, 5*time.Second, chromedp.Evaluate[bool](`window.pwned === undefined`)),
		"no script of a queue's name ran")

	// The page follows the queue: the holders leave, the two oldest
	// waiters take their permits.
	for _, h := range holders {
		h.Release()
	}
	got = waitShown(t, tab, 10*time.Second, func(m map[string]shown) bool {
		return m[pool].Waiting == "1" && m[pool].InFlight == "2"
	})
	assert.Equal(t, "1", got[pool].ClusterWaiting)
	assert.Equal(t, "2", got[pool].Upstreams[0].InFlight)

	// Caddy gone: the page says it cannot read, and keeps what it showed.
	c.Kill()
	browser.Do(t, tab, 10*time.Second, chromedp.WaitVisible(chromedp.CSS(`#status[data-state="error"]`)))
	assert.Contains(t, browser.Text(t, tab, "#status"), "cannot read ?format=json")
	got = waitShown(t, tab, 0, func(m map[string]shown) bool { return len(m) == 2 })
	assert.Equal(t, "1", got[pool].Waiting)
}

func TestStatusPageShowsTokensHeldAgainstKVTokens(t *testing.T) {
	c, upstream := kvSite(t)
	tab := browser.Start(t)
	url := c.URL() + "/v1/chat/completions"
	holders := []*harness.Stream{harness.StartStream(t, url), harness.StartStream(t, url)}
	c.WaitQueue(kvQueue, 0, 2, 10*time.Second)
	harness.StartStream(t, url) // no room for its 100 tokens: it waits
	c.WaitQueue(kvQueue, 1, 2, 10*time.Second)

	browser.Do(t, tab, 30*time.Second, chromedp.Navigate(c.URL()+pagePath))
	browser.Do(t, tab, 10*time.Second, chromedp.WaitVisible(chromedp.CSS(`#status[data-state="ok"]`)))
	q := waitShown(t, tab, 5*time.Second, func(m map[string]shown) bool { return len(m) == 1 })[kvQueue]
	assert.Equal(t, fmt.Sprintf("2 / %d", kvPermits), q.ClusterInFlight, "permits are free: tokens hold the third back")
	assert.Equal(t, "200", q.KVTokens, "the tokens this instance's requests hold")
	assert.Equal(t, fmt.Sprintf("200 / %d", kvCapacity), q.ClusterKVTokens, "the queue's, against the upstream's kv_tokens")
	assert.Equal(t, "4.00 bytes per token, from 0 answers", q.PromptEstimate, "the seed: no answer ended yet")
	require.Len(t, q.Upstreams, 1)
	assert.Equal(t, upstream, q.Upstreams[0].Dial)
	assert.Equal(t, fmt.Sprintf("200 / %d", kvCapacity), q.Upstreams[0].KVTokens)
	assert.False(t, q.Other, "the tokens are shown, not listed as fields the page does not know")

	// The holders leave: the waiter's 100 tokens are all that is held.
	for _, h := range holders {
		h.Release()
	}
	q = waitShown(t, tab, 10*time.Second, func(m map[string]shown) bool { return m[kvQueue].KVTokens == "100" })[kvQueue]
	assert.Equal(t, fmt.Sprintf("100 / %d", kvCapacity), q.ClusterKVTokens)
	assert.Equal(t, fmt.Sprintf("100 / %d", kvCapacity), q.Upstreams[0].KVTokens)
}
