package caddyfairqueue

import (
	"context"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// An error answer (a request the upstream refuses as invalid: 400, 404)
// comes at once, before the backend schedules anything: it is no time to
// first token. A client that streams many such requests must not dilute
// the slow first tokens of everybody else's streams below breach_share,
// or one client keeps the learned capacity at its ceiling while the
// backend is overloaded.
func TestAdaptiveDoesNotTimeErrorAnswers(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	const interval = 3 * time.Second
	h := provisionLocal(t, newContext(t), &Handler{Name: "adapt-errors", Permits: 16,
		Adaptive: &AdaptiveConfig{TargetTTFT: caddy.Duration(100 * time.Millisecond), MinSamples: 10, BreachShare: 0.2,
			Interval: caddy.Duration(interval)}})
	srv := serve(t, h, proxyTo(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		if strings.Contains(string(body), `"model":"nonexistent"`) {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusNotFound)
			_, _ = io.WriteString(w, `{"error":{"message":"The model does not exist.","code":404}}`)
			return
		}
		time.Sleep(300 * time.Millisecond) // an overloaded backend: the first token comes late
		w.Header().Set("Content-Type", "text/event-stream")
		_, _ = io.WriteString(w, "data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}]}\n\ndata: [DONE]\n\n")
	})))
	send := func(body string, status int) {
		resp := srv.post(t, context.Background(), body)
		_, _ = io.Copy(io.Discard, resp.Body)
		_ = resp.Body.Close()
		assert.Equal(t, status, resp.StatusCode)
		assert.Equal(t, outcomeGranted, srv.outcome(t))
	}
	// One client's requests for a model the backend does not serve,
	// answered at once.
	for range 60 {
		send(`{"model":"nonexistent","stream":true}`, http.StatusNotFound)
	}
	// Everybody else's, each first token 300 ms late (the target: 100 ms).
	honest := func(n int) {
		var wg sync.WaitGroup
		for range n {
			wg.Go(func() { send(`{"model":"m","stream":true}`, http.StatusOK) })
		}
		wg.Wait()
	}
	honest(10)
	// The next answer after the interval sends what this instance saw:
	// a window of 11 late first tokens.
	time.Sleep(interval + 100*time.Millisecond)
	honest(1)
	q := engineOf(t, h).q
	require.Eventually(t, func() bool { _, ok := q.Shares()[""]; return ok }, 5*time.Second, 10*time.Millisecond)
	assert.Eventually(t, func() bool { return q.Shares()[""] < 1 }, 2*time.Second, 10*time.Millisecond,
		"11 streams whose first token came 300 ms late (target 100 ms) did not bring the share down beside 60 errors: %v", q.Shares())
}
