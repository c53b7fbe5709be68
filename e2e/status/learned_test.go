//go:build e2e

package status

import (
	"fmt"
	"net/http"
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

// The queues of learnedSite, each with adaptive in front of a mock that
// refuses its first request with 503: the refusal brings the learned
// share to 0.9, so 3 of 4 permits are in force.
const (
	learnedQueue = "learned"
	learnedPool  = "learned-pool"
	learnedOf    = 4
)

// learnedSite runs Caddy with the page at pagePath, the queue
// learnedQueue under /q/ and the pool learnedPool under /p/, each in
// front of a mock of its own that refuses its first request.
func learnedSite(t *testing.T) (c *harness.Caddy, poolUpstream string) {
	t.Helper()
	_, plain := harness.StartMockLLM(t, mockllm.Config{Refuse: 1})
	_, poolUpstream = harness.StartMockLLM(t, mockllm.Config{Refuse: 1})
	c = harness.StartCaddy(t, "caddy", fmt.Sprintf(`
	handle %s {
		fair_queue_status
	}
	handle_path /q/* {
		fair_queue {
			name %s
			permits %d
			adaptive {
				target_ttft 10s
				interval 100ms
			}
		}
		reverse_proxy %s
	}
	handle_path /p/* {
		fair_queue {
			name %s
			upstream %s %d
			adaptive {
				target_ttft 10s
				interval 100ms
			}
		}
		reverse_proxy {
			dynamic fair_queue
		}
	}`, pagePath, learnedQueue, learnedOf, plain, learnedPool, poolUpstream, learnedOf), harness.CaddyOptions{})
	return c, poolUpstream
}

// The page shows the capacity adaptive holds in force beside the
// configured one: "permits 4" and "0 / 4" in flight read as a queue with
// room while only 3 permits are granted.
func TestStatusPageShowsTheCapacityInForce(t *testing.T) {
	c, upstream := learnedSite(t)
	tab := browser.Start(t)
	for _, path := range []string{"/q/v1/chat/completions", "/p/v1/chat/completions"} {
		resp, err := http.Post(c.URL()+path, "application/json", strings.NewReader(`{"model":"m"}`))
		require.NoError(t, err)
		resp.Body.Close()
		require.Equal(t, http.StatusServiceUnavailable, resp.StatusCode, "the mock's refusal, passed on")
		// The next answer carries the refusal's report to the queue.
		resp, err = http.Post(c.URL()+path, "application/json", strings.NewReader(`{"model":"m"}`))
		require.NoError(t, err)
		resp.Body.Close()
		require.Equal(t, http.StatusOK, resp.StatusCode)
	}

	browser.Do(t, tab, 30*time.Second, chromedp.Navigate(c.URL()+pagePath))
	browser.Do(t, tab, 10*time.Second, chromedp.WaitVisible(chromedp.CSS(`#status[data-state="ok"]`)))
	got := waitShown(t, tab, 20*time.Second, func(m map[string]shown) bool {
		p := m[learnedPool]
		return strings.Contains(m[learnedQueue].Store, "in force") && len(p.Upstreams) == 1 && p.Upstreams[0].Permits != fmt.Sprint(learnedOf)
	})
	q := got[learnedQueue]
	assert.Contains(t, q.Store, fmt.Sprintf("permits %d (3 in force, adaptive)", learnedOf))
	assert.Equal(t, "0 / 3", q.ClusterInFlight, "in flight against the permits in force")
	assert.False(t, q.Other, "the learned share is shown, not listed as a field the page does not know")
	p := got[learnedPool]
	require.Len(t, p.Upstreams, 1)
	assert.Equal(t, upstream, p.Upstreams[0].Dial)
	assert.Equal(t, fmt.Sprintf("3 of %d", learnedOf), p.Upstreams[0].Permits)
	assert.False(t, p.Other)
}
