package caddyfairqueue

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
)

// served is a handler behind a real HTTP server, so that a client reads
// its response as it is streamed.
type served struct {
	url      string
	outcomes chan string // the outcome placeholder of each request, once served
}

// serve puts h, with next after it, behind an HTTP server. An error the
// handler returns is answered as Caddy would: its status, no body.
func serve(t *testing.T, h *Handler, next caddyhttp.Handler) *served {
	t.Helper()
	s := &served{outcomes: make(chan string, 100)}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		repl := caddyhttp.NewTestReplacer(r)
		r = r.WithContext(context.WithValue(r.Context(), caddyhttp.ExtraLogFieldsCtxKey, new(caddyhttp.ExtraLogFields)))
		if err := h.ServeHTTP(w, r, next); err != nil {
			status := http.StatusInternalServerError
			if he, ok := err.(caddyhttp.HandlerError); ok {
				status = he.StatusCode
			}
			w.WriteHeader(status)
		}
		outcome, _ := repl.GetString(phOutcome)
		s.outcomes <- outcome
	}))
	t.Cleanup(srv.Close)
	s.url = srv.URL
	return s
}

// post sends a chat request; it returns once the response header is in.
func (s *served) post(t *testing.T, ctx context.Context, body string) *http.Response {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, s.url+"/v1/chat/completions", strings.NewReader(body))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	t.Cleanup(func() { resp.Body.Close() })
	return resp
}

func (s *served) outcome(t *testing.T) string {
	t.Helper()
	select {
	case o := <-s.outcomes:
		return o
	case <-time.After(10 * time.Second):
		t.Fatal("request not served within 10s")
		return ""
	}
}

// events reads a response body as server-sent events: each block (the
// lines up to a blank line) is sent on the channel, without its final
// newline; the channel closes at the end of the body.
func events(body io.Reader) <-chan string {
	ch := make(chan string, 100)
	go func() {
		defer close(ch)
		sc := bufio.NewScanner(body)
		var block []string
		for sc.Scan() {
			if line := sc.Text(); line != "" {
				block = append(block, line)
				continue
			}
			ch <- strings.Join(block, "\n")
			block = nil
		}
	}()
	return ch
}

// nextEvent returns the next block of the stream.
func nextEvent(t *testing.T, ch <-chan string) string {
	t.Helper()
	select {
	case e, ok := <-ch:
		require.True(t, ok, "the stream ended")
		return e
	case <-time.After(10 * time.Second):
		t.Fatal("no event within 10s")
		return ""
	}
}

// rest returns the blocks left in the stream, until it ends.
func rest(t *testing.T, ch <-chan string) []string {
	t.Helper()
	var out []string
	for {
		select {
		case e, ok := <-ch:
			if !ok {
				return out
			}
			out = append(out, e)
		case <-time.After(10 * time.Second):
			t.Fatal("the stream did not end within 10s")
		}
	}
}

// holdPermit takes the only permit of h's queue, as another request
// would; release gives it back.
func holdPermit(t *testing.T, h *Handler) (release func()) {
	t.Helper()
	warm := newRequest(context.Background(), ``).start(h, okHandler).wait(t) // opens the queue
	require.NoError(t, warm.err)
	p, err := engineOf(t, h).q.Acquire(context.Background(), fairqueue.Request{})
	require.NoError(t, err)
	t.Cleanup(p.Release)
	return p.Release
}

// sseUpstream is an LLM upstream that streams two chunks and [DONE],
// with a header of its own that a committed stream cannot pass on.
func sseUpstream(t *testing.T) caddyhttp.Handler {
	t.Helper()
	return proxyTo(t, http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		w.Header().Set("X-Upstream", "yes")
		w.WriteHeader(http.StatusCreated)
		for _, chunk := range []string{`{"choices":[{"delta":{"content":"Hel"}}]}`, `{"choices":[{"delta":{"content":"lo"}}]}`, `[DONE]`} {
			_, _ = io.WriteString(w, "data: "+chunk+"\n\n")
			w.(http.Flusher).Flush()
		}
	}))
}

// proxyTo starts upstream and returns a next handler proxying to it.
func proxyTo(t *testing.T, upstream http.Handler) caddyhttp.Handler {
	t.Helper()
	srv := httptest.NewServer(upstream)
	t.Cleanup(srv.Close)
	u, _ := url.Parse(srv.URL)
	proxy := httputil.NewSingleHostReverseProxy(u)
	proxy.FlushInterval = -1
	return caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
		proxy.ServeHTTP(w, r)
		return nil
	})
}

// keepaliveHandler is a local queue of one permit with sse_keepalive.
func keepaliveHandler(t *testing.T, name string, h *Handler) *Handler {
	t.Helper()
	h.Name, h.Permits = name, 1
	if h.SSEKeepalive == 0 {
		h.SSEKeepalive = caddy.Duration(100 * time.Millisecond)
	}
	if h.MaxWait == 0 {
		h.MaxWait = caddy.Duration(5 * time.Second)
	}
	return provisionLocal(t, newContext(t), h)
}

func TestKeepaliveSendsCommentsWhileWaitingThenRelaysUpstreamEvents(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	h := keepaliveHandler(t, "ka-relay", &Handler{})
	srv := serve(t, h, sseUpstream(t))
	release := holdPermit(t, h)

	resp := srv.post(t, context.Background(), `{"model":"m","stream":true}`)
	assert.Equal(t, http.StatusOK, resp.StatusCode, "the header is sent while the request waits")
	assert.Equal(t, "text/event-stream", resp.Header.Get("Content-Type"))
	assert.Equal(t, "no-cache", resp.Header.Get("Cache-Control"))
	assert.Equal(t, "no", resp.Header.Get("X-Accel-Buffering"))
	ch := events(resp.Body)
	for range 3 {
		assert.Regexp(t, `^: queued (position=1 )?waited=\d+s$`, nextEvent(t, ch), "next in line")
	}

	release()
	var got []string
	for _, e := range rest(t, ch) {
		if !strings.HasPrefix(e, ": queued") { // a last comment may race the grant
			got = append(got, e)
		}
	}
	assert.Equal(t, []string{
		`data: {"choices":[{"delta":{"content":"Hel"}}]}`,
		`data: {"choices":[{"delta":{"content":"lo"}}]}`,
		`data: [DONE]`,
	}, got, "the upstream's events, as they came")
	assert.Empty(t, resp.Header.Get("X-Upstream"), "the upstream's header came too late to be sent")
	assert.Equal(t, "granted", srv.outcome(t))
}

func TestKeepaliveTurnsARejectIntoTheRejectEventOnTheOpenStream(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	for _, tc := range []struct {
		name   string
		reject []*RejectConfig
		want   string
	}{
		{"default event", nil, "event: error\ndata: {"},
		{"configured event", []*RejectConfig{{SSEEvent: "busy", SSEStatus: 503, SSEData: `{"reason":"{http.fair_queue.reason}"}`}},
			"event: busy\ndata: {\"reason\":\"timeout\"}"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := keepaliveHandler(t, "ka-reject-"+strings.ReplaceAll(tc.name, " ", "-"),
				&Handler{MaxWait: caddy.Duration(450 * time.Millisecond), Reject: tc.reject})
			srv := serve(t, h, sseUpstream(t))
			holdPermit(t, h)

			resp := srv.post(t, context.Background(), `{"stream":true}`)
			assert.Equal(t, http.StatusOK, resp.StatusCode, "sse_status cannot apply: the header was sent")
			assert.Empty(t, resp.Header.Get("Fair-Queue-Reason"), "the reason header was already past")
			ch := events(resp.Body)
			assert.Regexp(t, `^: queued`, nextEvent(t, ch))
			blocks := rest(t, ch)
			require.NotEmpty(t, blocks)
			last := blocks[len(blocks)-1]
			assert.True(t, strings.HasPrefix(last, tc.want), "last event %q", last)
			if tc.reject == nil {
				var e apiError
				require.NoError(t, json.Unmarshal([]byte(strings.TrimPrefix(last, "event: error\ndata: ")), &e))
				assert.Equal(t, "timeout", e.Error.Code, "the reason is in the data")
				assert.Equal(t, "rate_limit_exceeded", e.Error.Type)
			}
			for _, b := range blocks[:len(blocks)-1] {
				assert.Regexp(t, `^: queued`, b)
			}
			assert.Equal(t, "timeout", srv.outcome(t))
		})
	}
}

func TestKeepaliveNeverFeedsANonStreamingRequest(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	h := keepaliveHandler(t, "ka-plain", &Handler{})
	srv := serve(t, h, proxyTo(t, http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("X-Upstream", "yes")
		w.WriteHeader(http.StatusCreated)
		_, _ = io.WriteString(w, `{"id":"1"}`)
	})))
	release := holdPermit(t, h)

	done := make(chan *http.Response, 1)
	go func() { done <- srv.post(t, context.Background(), `{"model":"m","stream":false}`) }()
	select {
	case <-done:
		t.Fatal("a non-streaming request got its header while waiting")
	case <-time.After(450 * time.Millisecond): // four intervals
	}
	release()
	resp := <-done
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	assert.Equal(t, http.StatusCreated, resp.StatusCode, "the upstream's own status")
	assert.Equal(t, "yes", resp.Header.Get("X-Upstream"))
	assert.JSONEq(t, `{"id":"1"}`, string(body))
	assert.Equal(t, "granted", srv.outcome(t))
}

func TestKeepaliveLeavesAStreamGrantedInTimeToTheUpstream(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	h := keepaliveHandler(t, "ka-fast", &Handler{})
	srv := serve(t, h, sseUpstream(t))
	resp := srv.post(t, context.Background(), `{"stream":true}`)
	assert.Equal(t, http.StatusCreated, resp.StatusCode, "granted at once: the upstream's status")
	assert.Equal(t, "yes", resp.Header.Get("X-Upstream"))
	blocks := rest(t, events(resp.Body))
	assert.Len(t, blocks, 3)
	for _, b := range blocks {
		assert.NotContains(t, b, "queued")
	}
}

func TestKeepaliveTurnsAnUpstreamErrorIntoAnSSEErrorEvent(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	upstream := func(status int, body string) caddyhttp.Handler {
		return proxyTo(t, http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(status)
			_, _ = io.WriteString(w, body)
		}))
	}
	for _, tc := range []struct {
		name string
		next caddyhttp.Handler
		want string
	}{
		{"JSON error is passed on, on one line",
			upstream(http.StatusServiceUnavailable, "{\n  \"error\": {\"message\": \"overloaded\", \"type\": \"server_error\", \"code\": \"busy\"}\n}"),
			`{"error":{"message":"overloaded","type":"server_error","code":"busy"}}`},
		{"other error body becomes the default error object",
			upstream(http.StatusBadGateway, "<html>bad gateway</html>"),
			`{"error":{"message":"The upstream server answered with status 502 Bad Gateway.","type":"server_error","code":"upstream_error"}}`},
		{"rate limit",
			upstream(http.StatusTooManyRequests, ""),
			`{"error":{"message":"The upstream server answered with status 429 Too Many Requests.","type":"rate_limit_exceeded","code":"upstream_error"}}`},
		{"failing next handler",
			caddyhttp.HandlerFunc(func(http.ResponseWriter, *http.Request) error {
				return caddyhttp.Error(http.StatusBadGateway, io.ErrUnexpectedEOF)
			}),
			`{"error":{"message":"The upstream server answered with status 502 Bad Gateway.","type":"server_error","code":"upstream_error"}}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := keepaliveHandler(t, "ka-upstream-error-"+strings.ReplaceAll(tc.name, " ", "-"), &Handler{})
			srv := serve(t, h, tc.next)
			release := holdPermit(t, h)

			resp := srv.post(t, context.Background(), `{"stream":true}`)
			ch := events(resp.Body)
			assert.Regexp(t, `^: queued`, nextEvent(t, ch))
			release()
			blocks := rest(t, ch)
			require.NotEmpty(t, blocks)
			assert.Equal(t, "event: error\ndata: "+tc.want, blocks[len(blocks)-1])
			assert.Equal(t, http.StatusOK, resp.StatusCode)
			assert.Equal(t, "granted", srv.outcome(t))
		})
	}
}

func TestKeepaliveSendsQueueEventsOnlyWhenAskedFor(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	h := keepaliveHandler(t, "ka-events", &Handler{SSEQueueEvents: true})
	srv := serve(t, h, sseUpstream(t))
	holdPermit(t, h)

	ctx, cancel := context.WithCancel(context.Background())
	resp := srv.post(t, ctx, `{"stream":true}`)
	ch := events(resp.Body)
	assert.Regexp(t, `^: queued (position=1 )?waited=0s$`, nextEvent(t, ch))
	assert.Regexp(t, `^event: queue\ndata: \{"position":(1|null),"eta_s":null,"waited_s":0\}$`, nextEvent(t, ch),
		"after the comment, the queue event with what is known")
	cancel() // the client leaves while it waits
	assert.Equal(t, "cancelled", srv.outcome(t))
}

func TestWaitStatusPrintsWhatIsKnown(t *testing.T) {
	st := waitStatus{waited: 12500 * time.Millisecond}
	assert.Equal(t, ": queued waited=12s\n\n", string(st.comment()))
	assert.Equal(t, "event: queue\ndata: {\"position\":null,\"eta_s\":null,\"waited_s\":12}\n\n", string(st.event()))

	st = waitStatus{position: 3, eta: 4100 * time.Millisecond, waited: time.Second}
	assert.Equal(t, ": queued position=3 eta=5s waited=1s\n\n", string(st.comment()))
	assert.Equal(t, "event: queue\ndata: {\"position\":3,\"eta_s\":5,\"waited_s\":1}\n\n", string(st.event()))
}

func TestCommittedWriterDropsInformationalStatusAndBoundsErrorBody(t *testing.T) {
	rec := httptest.NewRecorder()
	cw := &committedWriter{w: rec, header: make(http.Header)}
	cw.WriteHeader(http.StatusEarlyHints)
	cw.WriteHeader(http.StatusInternalServerError)
	cw.WriteHeader(http.StatusOK) // superfluous: the first final status stands
	n, err := cw.Write([]byte(strings.Repeat("x", maxUpstreamErrorBody+100)))
	require.NoError(t, err)
	assert.Equal(t, maxUpstreamErrorBody+100, n)
	assert.Equal(t, http.StatusInternalServerError, cw.status)
	assert.Equal(t, maxUpstreamErrorBody+1, cw.errBody.Len(), "one byte more than the bound: known too long")
	assert.Zero(t, rec.Body.Len(), "an error body is held back")
	assert.Contains(t, string(upstreamError(cw.status, cw.errBody.Bytes())), `"code":"upstream_error"`)
}

// TestUpstreamErrorEventIsOneTheOpenAIPythonClientRaises: OpenAI's
// Python client raises an SSE error event only when its data has an
// "error" member (Stream.__stream__, _raise_streaming_error); any other
// data it yields to the caller as a completion chunk, and the stream
// then ends as if answered. An upstream's JSON error without one (SGLang
// and vLLM before 0.10 answer {"object":"error","message":...}; a JSON
// string or null) must still reach it as an error.
func TestUpstreamErrorEventIsOneTheOpenAIPythonClientRaises(t *testing.T) {
	for _, body := range []string{
		`{"object":"error","message":"This model's maximum context length is 4096 tokens.","type":"BadRequestError","param":null,"code":400}`,
		`"Internal Server Error"`,
		`null`,
		`{"detail":"Not Found"}`,
	} {
		var data map[string]any
		require.NoError(t, json.Unmarshal(upstreamError(http.StatusBadRequest, []byte(body)), &data), body)
		assert.NotEmpty(t, data["error"], "%s: the event's data has an error member", body)
	}
	// An OpenAI-shaped error is passed on as it is.
	assert.Equal(t, `{"error":{"message":"m","type":"t","code":"c"}}`,
		string(upstreamError(http.StatusBadRequest, []byte(`{"error": {"message":"m","type":"t","code":"c"}}`))))
}
