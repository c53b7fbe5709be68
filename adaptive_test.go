package caddyfairqueue

import (
	"context"
	"io"
	"net/http"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
)

func TestCaddyfileParsesTheAdaptiveBlock(t *testing.T) {
	h, err := parse("fair_queue {\npermits 64\nadaptive {\ntarget_ttft 2s\nfloor 0.1\ninterval 500ms\ndecrease 0.8\nstep 0.05\nbreach_share 0.05\nmin_samples 40\n}\n}")
	require.NoError(t, err)
	require.NotNil(t, h.Adaptive)
	assert.Equal(t, AdaptiveConfig{TargetTTFT: caddy.Duration(2 * time.Second), Floor: 0.1, Interval: caddy.Duration(500 * time.Millisecond),
		Decrease: 0.8, Step: 0.05, BreachShare: 0.05, MinSamples: 40}, *h.Adaptive)
	assert.Equal(t, &fairqueue.Adaptive{TargetTTFT: 2 * time.Second, Floor: 0.1, Interval: 500 * time.Millisecond, Decrease: 0.8,
		Step: 0.05, BreachShare: 0.05, MinSamples: 40}, h.settings().cfg.Adaptive)
	assert.Equal(t, "adaptive (off and {target_ttft: 2s})",
		(&Handler{Permits: 1}).settings().diff((&Handler{Permits: 1, Adaptive: &AdaptiveConfig{TargetTTFT: caddy.Duration(2 * time.Second)}}).settings()))
}

func TestCaddyfileRefusesBadAdaptiveOptionsNamingTheLine(t *testing.T) {
	for _, tc := range []struct {
		name, body, wantErr string
	}{
		{"no target", "adaptive {\nfloor 0.5\n}", "adaptive: target_ttft is required"},
		{"floor above 1", "adaptive {\ntarget_ttft 1s\nfloor 2\n}", "floor"},
		{"short interval", "adaptive {\ntarget_ttft 1s\ninterval 10ms\n}", "interval"},
		{"decrease of 1", "adaptive {\ntarget_ttft 1s\ndecrease 1\n}", "decrease"},
		{"unknown option", "adaptive {\ntarget_ttft 1s\ntarget 2s\n}", "target"},
		{"an argument", "adaptive on {\ntarget_ttft 1s\n}", "wrong argument count"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := parse("fair_queue {\npermits 4\n" + tc.body + "\n}")
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.wantErr)
			assert.Contains(t, err.Error(), "Testfile:", "the error carries the file and line")
		})
	}
}

func TestJSONConfigErrorsOfTheAdaptiveBlockNameTheField(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	for _, tc := range []struct {
		name, fields, want string
	}{
		{"no target", `"permits":1,"adaptive":{}`, `adaptive.target_ttft: is required`},
		{"floor above 1", `"permits":1,"adaptive":{"target_ttft":"1s","floor":2}`, `adaptive.floor: must be in (0, 1], got 2`},
		{"typo", `"permits":1,"adaptive":{"target_ttf":"1s"}`, `target_ttft`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := loadHandlerJSON(t, tc.fields)
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.want)
		})
	}
	require.NoError(t, loadHandlerJSON(t, `"permits":8,"adaptive":{"target_ttft":"1500ms"}`))
}

// A 429/503 from the upstream is a refusal (docs/adaptive.md: "counts
// answers 429 and 503"), whether or not sse_keepalive had committed the
// stream while the request waited: the share comes down.
func TestAdaptiveCountsARefusalOnACommittedStream(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	for _, tc := range []struct {
		name string
		wait bool
	}{
		{"granted at once", false},
		{"committed by the keepalive while waiting", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := keepaliveHandler(t, "adapt-refused-"+map[bool]string{false: "plain", true: "committed"}[tc.wait], &Handler{
				Adaptive: &AdaptiveConfig{TargetTTFT: caddy.Duration(time.Second), MinSamples: 1, Interval: caddy.Duration(100 * time.Millisecond)}})
			srv := serve(t, h, proxyTo(t, http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
				w.Header().Set("Content-Type", "application/json")
				w.WriteHeader(http.StatusTooManyRequests)
				_, _ = io.WriteString(w, `{"error":{"message":"busy"}}`)
			})))
			if tc.wait {
				release := holdPermit(t, h)
				resp := srv.post(t, context.Background(), `{"stream":true}`)
				ch := events(resp.Body)
				assert.Regexp(t, `^: queued`, nextEvent(t, ch))
				release()
				rest(t, ch)
			} else {
				resp := srv.post(t, context.Background(), `{"stream":true}`)
				assert.Equal(t, http.StatusTooManyRequests, resp.StatusCode)
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
			assert.Equal(t, "granted", srv.outcome(t))
			q := engineOf(t, h).q
			assert.Eventually(t, func() bool { s, ok := q.Shares()[""]; return ok && s < 1 }, 2*time.Second, 10*time.Millisecond,
				"the upstream's 429 did not bring the share down: %v", q.Shares())
		})
	}
}

// A plain (not streamed) answer's first byte comes after the whole
// generation, so it says nothing of the backend's time to first token:
// a learned capacity times streamed answers only. Plain answers slower
// than target_ttft leave the share alone; the same delay before a
// stream's first chunk brings it down.
func TestAdaptiveTimesStreamedAnswersOnly(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	for _, tc := range []struct {
		name, body string
		answer     func(http.ResponseWriter) // the upstream's, as the body asked
		down       bool
	}{
		{"plain answers", `{"model":"m"}`, func(w http.ResponseWriter) {
			w.Header().Set("Content-Type", "application/json")
			_, _ = io.WriteString(w, `{"choices":[{"message":{"content":"hi"}}]}`)
		}, false},
		{"streamed answers", `{"model":"m","stream":true}`, func(w http.ResponseWriter) {
			w.Header().Set("Content-Type", "text/event-stream")
			_, _ = io.WriteString(w, "data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}]}\n\ndata: [DONE]\n\n")
		}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := keepaliveHandler(t, "adapt-plain-"+map[bool]string{false: "plain", true: "stream"}[tc.down], &Handler{
				Adaptive: &AdaptiveConfig{TargetTTFT: caddy.Duration(50 * time.Millisecond), MinSamples: 1,
					Interval: caddy.Duration(fairqueue.MinAdaptiveInterval)}})
			srv := serve(t, h, proxyTo(t, http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
				time.Sleep(200 * time.Millisecond) // the generation, or the prefill before a stream's first chunk
				tc.answer(w)
			})))
			q := engineOf(t, h).q
			for range 4 {
				resp := srv.post(t, context.Background(), tc.body)
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				require.Equal(t, http.StatusOK, resp.StatusCode)
				time.Sleep(time.Duration(fairqueue.MinAdaptiveInterval))
			}
			if tc.down {
				assert.Eventually(t, func() bool { s, ok := q.Shares()[""]; return ok && s < 1 }, 2*time.Second, 10*time.Millisecond,
					"streams whose first chunk came 200 ms after forwarding (target 50 ms) did not bring the share down: %v", q.Shares())
				return
			}
			time.Sleep(500 * time.Millisecond)
			s, ok := q.Shares()[""]
			assert.True(t, !ok || s == 1, "plain answers, whose first byte comes after the whole generation, brought the share down: %v", q.Shares())
		})
	}
}
