package caddyfairqueue

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
)

// refuserAfterMaxWait is an upstream that refuses every request with a 503
// whose header comes after the queue's max_wait (1s): the held refusal
// is cut at once (heldBound) and the client gets the timeout reject.
func refuserAfterMaxWait(t *testing.T) string {
	t.Helper()
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		time.Sleep(1500 * time.Millisecond)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusServiceUnavailable)
		_, _ = io.WriteString(w, `{"error":{"message":"busy"}}`)
	}))
	t.Cleanup(up.Close)
	return strings.TrimPrefix(up.URL, "http://")
}

// postTimedOut sends one request to url and requires the timeout reject.
func postTimedOut(t *testing.T, url string) {
	t.Helper()
	client := &http.Client{Timeout: 20 * time.Second}
	resp, err := client.Post(url+"/v1/chat/completions", "application/json", strings.NewReader(`{"model":"m","messages":[]}`))
	require.NoError(t, err)
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.NoError(t, err)
	require.Equal(t, http.StatusTooManyRequests, resp.StatusCode, "%s", body)
	require.Equal(t, "timeout", resp.Header.Get("Fair-Queue-Reason"), "%s", body)
}

// A requeue_on refusal that comes after max_wait is counted as any
// refusal the request was requeued for (docs/operations.md, docs/adaptive.md),
// though its held answer is cut there and the requeue finds no wait
// left: a requeue (requeues_total), a cooldown, and for an adaptive
// queue a refusal of its upstream, which brings the upstream's share
// down.
func TestARefusalAfterMaxWaitCountsAsARequeuedRefusal(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	const name = "requeue-late-counts"
	dial := refuserAfterMaxWait(t)
	url := runCaddy(t,
		fmt.Sprintf(`{"handler":"fair_queue","name":%q,"upstreams":[{"dial":%q,"permits":1}],
			"requeue_on":[503],"max_wait":"1s","upstream_cooldown":"100ms",
			"adaptive":{"target_ttft":"1s","min_samples":1,"interval":"100ms"}}`, name, dial),
		`{"handler":"reverse_proxy","dynamic_upstreams":{"source":"fair_queue"}}`)
	initMetrics()
	requeues := metrics.requeues.WithLabelValues(name, dial, "503")
	cooldowns := metrics.cooldowns.WithLabelValues(name, dial)
	requeues0, cooldowns0 := testutil.ToFloat64(requeues), testutil.ToFloat64(cooldowns)

	postTimedOut(t, url)

	assert.Equal(t, 1.0, testutil.ToFloat64(requeues)-requeues0, "requeues_total of the refusal after max_wait")
	assert.Equal(t, 1.0, testutil.ToFloat64(cooldowns)-cooldowns0, "upstream_cooldowns_total of the refusal after max_wait")
	e := namesakes.live(name)
	require.NotNil(t, e)
	assert.Eventually(t, func() bool { s, ok := e.q.Shares()[dial]; return ok && s < 1 }, 5*time.Second, 10*time.Millisecond,
		"the upstream's 503 after max_wait did not bring its share down: %v", e.q.Shares())
}

// A refusal after max_wait whose requeue the local store grants at once
// on another upstream (dispatch hands the requeued ticket the other
// upstream's free permit as the store call lands) still ends in the
// timeout reject, which is counted as one: rejects_total{reason="timeout"}
// as requests_total{outcome="timeout"}.
func TestARefusalAfterMaxWaitGrantedAgainCountsItsTimeoutReject(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	const name = "requeue-late-granted"
	a, b := refuserAfterMaxWait(t), refuserAfterMaxWait(t)
	url := runCaddy(t,
		fmt.Sprintf(`{"handler":"fair_queue","name":%q,"upstreams":[{"dial":%q,"permits":1},{"dial":%q,"permits":1}],
			"requeue_on":[503],"max_wait":"1s","upstream_cooldown":"100ms"}`, name, a, b),
		`{"handler":"reverse_proxy","dynamic_upstreams":{"source":"fair_queue"}}`)
	initMetrics()
	rejects := metrics.rejects.WithLabelValues(name, string(fairqueue.ReasonTimeout))
	outcomes := metrics.requests.WithLabelValues(name, string(fairqueue.ReasonTimeout))
	rejects0, outcomes0 := testutil.ToFloat64(rejects), testutil.ToFloat64(outcomes)

	postTimedOut(t, url)

	assert.Equal(t, 1.0, testutil.ToFloat64(outcomes)-outcomes0, "requests_total{outcome=timeout}")
	assert.Equal(t, 1.0, testutil.ToFloat64(rejects)-rejects0, "rejects_total{reason=timeout}")
}
