package caddyfairqueue

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
)

// renderReject writes the reject of reason under the given reject config.
func renderReject(t *testing.T, cfg []*RejectConfig, rej *fairqueue.RejectError, streaming bool, placeholders map[string]any) *httptest.ResponseRecorder {
	t.Helper()
	policies, err := compileRejects(cfg)
	require.NoError(t, err)
	repl := caddy.NewReplacer()
	for k, v := range placeholders {
		repl.Set(k, v)
	}
	w := httptest.NewRecorder()
	require.NoError(t, policies[rej.Reason].write(w, repl, rej, streaming, apiOpenAI))
	return w
}

func TestRejectDefaultsAreOpenAIErrorsWithReasonAndRetryAfter(t *testing.T) {
	for _, tc := range []struct {
		reason     fairqueue.Reason
		status     int
		errType    string
		messageHas string
	}{
		{fairqueue.ReasonTimeout, 429, "rate_limit_exceeded", "waited 20s in the queue"},
		{fairqueue.ReasonQueueFull, 429, "rate_limit_exceeded", "queue is full"},
		{fairqueue.ReasonShuttingDown, 503, "server_error", "shutting down"},
		{fairqueue.ReasonStoreUnavailable, 503, "server_error", "temporarily unavailable"},
	} {
		t.Run(string(tc.reason), func(t *testing.T) {
			rej := &fairqueue.RejectError{Reason: tc.reason, Waited: 20 * time.Second, RetryAfter: 7 * time.Second}
			w := renderReject(t, nil, rej, false, nil)
			assert.Equal(t, tc.status, w.Code)
			assert.Equal(t, string(tc.reason), w.Header().Get("Fair-Queue-Reason"))
			assert.Equal(t, "7", w.Header().Get("Retry-After"))
			assert.Equal(t, "application/json", w.Header().Get("Content-Type"))
			assert.Equal(t, w.Body.Len(), mustAtoi(t, w.Header().Get("Content-Length")))

			var got apiError
			require.NoError(t, json.Unmarshal(w.Body.Bytes(), &got), "body %s", w.Body)
			assert.Equal(t, string(tc.reason), got.Error.Code)
			assert.Equal(t, tc.errType, got.Error.Type)
			assert.Contains(t, got.Error.Message, tc.messageHas)
			assert.Contains(t, got.Error.Message, "retry after 7 seconds")
		})
	}
}

func TestRejectToStreamingRequestIsAnSSEErrorEvent(t *testing.T) {
	rej := &fairqueue.RejectError{Reason: fairqueue.ReasonTimeout, Waited: time.Second, RetryAfter: 3 * time.Second}
	w := renderReject(t, nil, rej, true, nil)

	assert.Equal(t, http.StatusOK, w.Code)
	assert.Equal(t, "text/event-stream", w.Header().Get("Content-Type"))
	assert.Equal(t, "no-cache", w.Header().Get("Cache-Control"))
	assert.Equal(t, "timeout", w.Header().Get("Fair-Queue-Reason"))
	assert.Equal(t, "3", w.Header().Get("Retry-After"))
	assert.True(t, w.Flushed, "the event is flushed")

	body := w.Body.String()
	require.True(t, strings.HasPrefix(body, "event: error\ndata: "), body)
	require.True(t, strings.HasSuffix(body, "\n\n"), body)
	data := strings.TrimSuffix(strings.TrimPrefix(body, "event: error\ndata: "), "\n\n")
	var got apiError
	require.NoError(t, json.Unmarshal([]byte(data), &got))
	assert.Equal(t, "timeout", got.Error.Code)
}

func TestRejectTemplatesReplacePlaceholdersJSONEscaped(t *testing.T) {
	cfg := []*RejectConfig{{
		Body: `{"error":{"message":"{http.fair_queue.message}","model":"{http.fair_queue.model}","retry":{http.fair_queue.retry_after},"keep":"{unknown.placeholder}"}}`,
	}}
	rej := &fairqueue.RejectError{Reason: fairqueue.ReasonQueueFull, RetryAfter: 2 * time.Second}
	w := renderReject(t, cfg, rej, false, map[string]any{phModel: "evil\"}\n<model>"})

	var got struct {
		Error struct {
			Message string `json:"message"`
			Model   string `json:"model"`
			Retry   int    `json:"retry"`
			Keep    string `json:"keep"`
		} `json:"error"`
	}
	require.NoError(t, json.Unmarshal(w.Body.Bytes(), &got), "body must stay valid JSON: %s", w.Body)
	assert.Equal(t, "evil\"}\n<model>", got.Error.Model)
	assert.Equal(t, 2, got.Error.Retry)
	assert.Contains(t, got.Error.Message, "queue is full")
	assert.Equal(t, "{unknown.placeholder}", got.Error.Keep, "unknown placeholders are left as they are")
	assert.Equal(t, 429, w.Code)
}

func TestRejectTemplatesKeepJSONStructureAndBackslashes(t *testing.T) {
	// A backslash before a brace is JSON's (an escaped backslash), and a
	// brace in one string never pairs with a brace in another.
	cfg := []*RejectConfig{{
		Body: `{"path":"C:\\{http.fair_queue.model}\\","{env.":"x","odd":"}","n":{http.fair_queue.retry_after}}`,
	}}
	rej := &fairqueue.RejectError{Reason: fairqueue.ReasonTimeout, RetryAfter: 3 * time.Second}
	w := renderReject(t, cfg, rej, false, map[string]any{phModel: "m{1}"})
	require.True(t, json.Valid(w.Body.Bytes()), "body must stay valid JSON: %s", w.Body)
	var got map[string]any
	require.NoError(t, json.Unmarshal(w.Body.Bytes(), &got))
	assert.Equal(t, map[string]any{"path": `C:\m{1}\`, "{env.": "x", "odd": "}", "n": float64(3)}, got)
}

func TestRejectSSEDataDefaultsToBodyAndSplitsLines(t *testing.T) {
	cfg := []*RejectConfig{{Body: "line one\nline two \"{http.fair_queue.reason}\" {http.fair_queue.retry_after}", SSEEvent: "queue"}}
	rej := &fairqueue.RejectError{Reason: fairqueue.ReasonTimeout, RetryAfter: time.Second}
	w := renderReject(t, cfg, rej, true, nil)
	assert.Equal(t, "event: queue\ndata: line one\ndata: line two \"timeout\" 1\n\n", w.Body.String())
}

// SDKs read an error status's body as a JSON error, never as a stream:
// a streaming request rejected with one gets the JSON answer.
func TestRejectStreamingWithAnErrorStatusIsJSON(t *testing.T) {
	rej := &fairqueue.RejectError{Reason: fairqueue.ReasonTimeout, Waited: 3 * time.Second, RetryAfter: 2 * time.Second}
	w := renderReject(t, []*RejectConfig{{SSEStatus: 429}}, rej, true, nil)
	assert.Equal(t, 429, w.Code)
	assert.Equal(t, "application/json", w.Header().Get("Content-Type"))
	assert.Equal(t, "2", w.Header().Get("Retry-After"))
	var got apiError
	require.NoError(t, json.Unmarshal(w.Body.Bytes(), &got), "body %s", w.Body)
	assert.Equal(t, "timeout", got.Error.Code)
	assert.Contains(t, got.Error.Message, "waited 3s in the queue")

	w = renderReject(t, []*RejectConfig{{SSEStatus: 503, Body: `{"busy":"{http.fair_queue.reason}"}`, SSEData: "not JSON"}}, rej, true, nil)
	assert.Equal(t, 503, w.Code)
	assert.Equal(t, "application/json", w.Header().Get("Content-Type"))
	assert.JSONEq(t, `{"busy":"timeout"}`, w.Body.String(), "the body template, not sse_data")

	w = renderReject(t, []*RejectConfig{{SSEStatus: 200}}, rej, true, nil)
	assert.Equal(t, 200, w.Code)
	assert.Equal(t, "text/event-stream", w.Header().Get("Content-Type"))
	assert.True(t, strings.HasPrefix(w.Body.String(), "event: error\ndata: {"), "a 2xx stream carries the event: %q", w.Body)
}

func TestRejectPerReasonOverridesDefaultsFieldByField(t *testing.T) {
	cfg := []*RejectConfig{
		{Status: 500, RetryAfter: "30s", SSEEvent: "busy"},
		{Reasons: []string{"timeout"}, Status: 504},
		{Reasons: []string{"timeout", "shutting_down"}, SSEStatus: 503},
	}
	policies, err := compileRejects(cfg)
	require.NoError(t, err)

	timeout := policies[fairqueue.ReasonTimeout]
	assert.Equal(t, 504, timeout.status, "the reason's own status wins")
	assert.Equal(t, 30*time.Second, timeout.retryAfter, "unset fields come from the defaults entry")
	assert.Equal(t, "busy", timeout.sseEvent)
	assert.Equal(t, 503, timeout.sseStatus)

	full := policies[fairqueue.ReasonQueueFull]
	assert.Equal(t, 500, full.status)
	assert.Equal(t, 200, full.sseStatus)

	down := policies[fairqueue.ReasonShuttingDown]
	assert.Equal(t, 500, down.status)
	assert.Equal(t, 503, down.sseStatus)

	unavailable := policies[fairqueue.ReasonStoreUnavailable]
	assert.Equal(t, 500, unavailable.status)
	assert.Equal(t, "busy", unavailable.sseEvent)
}

func TestRejectBuiltInDefaultsWithoutConfig(t *testing.T) {
	policies, err := compileRejects(nil)
	require.NoError(t, err)
	for _, r := range reasons {
		p := policies[r]
		require.NotNil(t, p, r)
		assert.Equal(t, http.StatusOK, p.sseStatus)
		assert.Equal(t, "error", p.sseEvent)
		assert.Zero(t, p.retryAfter, "auto")
	}
	assert.Equal(t, 429, policies[fairqueue.ReasonTimeout].status)
	assert.Equal(t, 429, policies[fairqueue.ReasonQueueFull].status)
	assert.Equal(t, 503, policies[fairqueue.ReasonShuttingDown].status)
	assert.Equal(t, 503, policies[fairqueue.ReasonStoreUnavailable].status)
}

func TestRetryAfterIsWholeSecondsRoundedUpAtLeastOne(t *testing.T) {
	for _, tc := range []struct {
		configured, estimate time.Duration
		want                 int
	}{
		{0, 0, 1},
		{0, 300 * time.Millisecond, 1},
		{0, 1200 * time.Millisecond, 2},
		{0, 20 * time.Second, 20},
		{10 * time.Second, 3 * time.Second, 10},
		{1500 * time.Millisecond, time.Minute, 2},
	} {
		assert.Equal(t, tc.want, retryAfterSeconds(tc.configured, tc.estimate), "%+v", tc)
	}
}

func TestRejectConfigCheckNamesTheField(t *testing.T) {
	for _, tc := range []struct {
		cfg     RejectConfig
		wantErr string
	}{
		{RejectConfig{Reasons: []string{"nope"}}, `reject: unknown reason "nope"`},
		{RejectConfig{Status: 42}, "reject: status must be 200-599"},
		{RejectConfig{SSEStatus: 1000}, "reject: sse_status must be 200-599"},
		{RejectConfig{RetryAfter: "-1s"}, "reject: retry_after must be a positive duration or auto"},
		{RejectConfig{SSEEvent: "a\nb"}, "reject: sse_event must be one line"},
	} {
		_, err := compileRejects([]*RejectConfig{&tc.cfg})
		require.Error(t, err)
		assert.Contains(t, err.Error(), tc.wantErr)
	}
}

func mustAtoi(t *testing.T, s string) int {
	t.Helper()
	var n int
	require.NoError(t, json.Unmarshal([]byte(s), &n))
	return n
}

func TestRejectMessageSaysOneSecond(t *testing.T) {
	rej := &fairqueue.RejectError{Reason: fairqueue.ReasonShuttingDown}
	assert.Equal(t, "The server is shutting down. Please retry after 1 second.", rejectMessage(rej, 1))
	assert.Equal(t, "The server is shutting down. Please retry after 2 seconds.", rejectMessage(rej, 2))
}
