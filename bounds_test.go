package caddyfairqueue

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
	"github.com/fair-queue/caddy-fair-queue/internal/redistest"
)

// serveHandler serves h, then next, on a real HTTP server: its
// ResponseWriter sets read deadlines, as Caddy's does.
func serveHandler(t *testing.T, h *Handler, next caddyhttp.Handler) string {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if err := h.ServeHTTP(w, r, next); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
		}
	}))
	t.Cleanup(srv.Close)
	return srv.Listener.Addr().String()
}

func TestHandlerAnswers408ToABodyThatStallsAndClosesTheConnection(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	const timeout = 300 * time.Millisecond
	// No Redis: a body that never arrives never reaches the queue.
	h := provision(t, newContext(t), "127.0.0.1:1", &Handler{Permits: 1, BodyTimeout: caddy.Duration(timeout)})
	addr := serveHandler(t, h, okHandler)

	conn, err := net.Dial("tcp", addr)
	require.NoError(t, err)
	defer conn.Close()
	require.NoError(t, conn.SetDeadline(time.Now().Add(30*time.Second)))
	start := time.Now()
	_, err = io.WriteString(conn, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 8388608\r\n\r\n{\"model\":\"m\"")
	require.NoError(t, err)
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, nil)
	require.NoError(t, err, "no answer: the stalled body holds the connection")
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	assert.GreaterOrEqual(t, time.Since(start), timeout)
	assert.Equal(t, http.StatusRequestTimeout, resp.StatusCode)
	assert.Equal(t, "application/json", resp.Header.Get("Content-Type"))
	assert.True(t, resp.Close, "Connection: close")
	var e apiError
	require.NoError(t, json.Unmarshal(body, &e), "%s", body)
	assert.Equal(t, "request_timeout", e.Error.Code)
	assert.Contains(t, e.Error.Message, "300ms")
	_, err = br.ReadByte()
	assert.ErrorIs(t, err, io.EOF, "the server closes the connection")
}

func TestHandlerLiftsTheBodyDeadlineOnceTheBodyIsRead(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	rds := redistest.Start(t)
	const timeout = 100 * time.Millisecond
	h := provision(t, newContext(t), rds.Addr(), &Handler{Permits: 1, BodyTimeout: caddy.Duration(timeout)})
	// A response that lasts well beyond the body's deadline: on HTTP/1 a
	// read deadline left in place would cancel the request's context
	// when it passes (reverse_proxy would cut the stream there).
	next := caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
		select {
		case <-r.Context().Done():
			w.WriteHeader(http.StatusServiceUnavailable)
		case <-time.After(5 * timeout):
			w.WriteHeader(http.StatusOK)
		}
		return nil
	})
	addr := serveHandler(t, h, next)

	resp, err := http.Post("http://"+addr+"/v1/chat/completions", "application/json", strings.NewReader(`{"model":"m","stream":true}`))
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, http.StatusOK, resp.StatusCode, "the request's context was cancelled while the response ran")
	settled(t, h)
}

// chatBody is a JSON chat request of exactly size bytes.
func chatBody(size int, stream bool) string {
	head := `{"model":"m","stream":` + strconv.FormatBool(stream) + `,"prompt":"`
	return head + strings.Repeat("x", size-len(head)-2) + `"}`
}

// waitingHead is what the head of a request of newRequest, its body of
// bodyLen bytes read, counts against max_waiting_bytes.
func waitingHead(bodyLen int) int64 {
	r := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", nil)
	r.Header.Set("Content-Length", strconv.Itoa(bodyLen))
	return waitingSize(r, 0)
}

func TestHandlerRejectsWaitersBeyondMaxWaitingBytesUntilTheyDrain(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	rds := redistest.Start(t)
	h := provision(t, newContext(t), rds.Addr(), &Handler{Name: "bytes", Permits: 1, MaxBody: 1000,
		MaxWaitingBytes: 1500 + waitingHead(1000) + waitingHead(400)})
	next := newHolder()
	ctx := context.Background()
	base := waitingBytes.Load()
	rejects := metrics.rejects.WithLabelValues("bytes", "queue_full")
	rejected := testutil.ToFloat64(rejects)

	holding := newRequest(ctx, `{}`).start(h, next)
	next.waitEntered(t)
	a := newRequest(ctx, chatBody(1000, false)).start(h, next)
	require.Eventually(t, func() bool { return waitingBytes.Load() == base+1000+waitingHead(1000) }, 10*time.Second, time.Millisecond, "a's body is not counted")

	// b's body would take the waiting bodies to 2000 bytes, beyond 1500
	// (and the requests' heads):
	// rejected at once, JSON or SSE as any reject, while a waits.
	b := newRequest(ctx, chatBody(1000, false)).start(h, next).wait(t)
	require.NoError(t, b.err)
	assert.Equal(t, http.StatusTooManyRequests, b.w.Code)
	assert.Equal(t, "queue_full", b.w.Header().Get("Fair-Queue-Reason"))
	assert.NotEmpty(t, b.w.Header().Get("Retry-After"))
	var e apiError
	require.NoError(t, json.Unmarshal(b.w.Body.Bytes(), &e), b.w.Body.String())
	assert.Equal(t, "queue_full", e.Error.Code)
	assert.Equal(t, "queue_full", b.placeholder(phOutcome))
	c := newRequest(ctx, chatBody(1000, true)).start(h, next).wait(t)
	require.NoError(t, c.err)
	assert.Equal(t, "text/event-stream", c.w.Header().Get("Content-Type"))
	assert.Contains(t, c.w.Body.String(), `"code":"queue_full"`)
	assert.Equal(t, rejected+2, testutil.ToFloat64(rejects), "rejects_total counts both")
	// A body that fits still waits.
	small := newRequest(ctx, chatBody(400, false)).start(h, next)
	require.Eventually(t, func() bool { return waitingBytes.Load() == base+1400+waitingHead(1000)+waitingHead(400) }, 10*time.Second, time.Millisecond, "a body that fits is not waiting")

	// The permit goes to a: its bytes are no longer waiting, and a new
	// body of 1000 bytes waits again.
	next.release <- struct{}{}
	holding.wait(t)
	next.waitEntered(t)
	require.Eventually(t, func() bool { return waitingBytes.Load() == base+400+waitingHead(400) }, 10*time.Second, time.Millisecond, "a's body still counted once granted")
	d := newRequest(ctx, chatBody(1000, false)).start(h, next)
	require.Eventually(t, func() bool { return waitingBytes.Load() == base+1400+waitingHead(1000)+waitingHead(400) }, 10*time.Second, time.Millisecond, "d is not waiting")
	for _, req := range []*request{a, small, d} {
		next.release <- struct{}{}
		req.wait(t)
		require.NoError(t, req.err)
		assert.Equal(t, http.StatusOK, req.w.Code)
		if req != d {
			next.waitEntered(t)
		}
	}
	assert.Equal(t, base, waitingBytes.Load(), "bytes left counted")
	settled(t, h)
}

func TestMaxWaitingBytesDefaultsToAtLeastMaxBody(t *testing.T) {
	for _, tc := range []struct {
		maxBody, want int64
	}{
		{0, DefaultMaxWaitingBytes},
		{1 << 20, DefaultMaxWaitingBytes},
		{1 << 30, 1 << 30},
	} {
		h := &Handler{Permits: 1, MaxBody: tc.maxBody}
		h.setDefaults()
		require.NoError(t, h.validate())
		assert.Equal(t, tc.want, h.MaxWaitingBytes, "max_body %d", tc.maxBody)
	}
}

// A request that its upstream refused and that waits again in the queue
// (requeue_on) holds its body as any waiter does: it counts against
// max_waiting_bytes, and a body that would take the waiting bodies
// beyond it gets 429 queue_full at once.
func TestRequeuedRequestsBodyCountsAgainstMaxWaitingBytes(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	h := provisionLocal(t, newContext(t), &Handler{Name: "bytes-requeue", MaxBody: 1000, MaxWaitingBytes: 1500 + waitingHead(1000),
		Upstreams: []fairqueue.Upstream{{Dial: "a:1", Permits: 1}}, RequeueOn: []int{503},
		UpstreamCooldown: caddy.Duration(time.Minute), MaxWait: caddy.Duration(5 * time.Second)})
	next := &pooled{answer: func(_ int, _ string, w http.ResponseWriter) error {
		return refuse(w, http.StatusServiceUnavailable, "") // the only upstream cools a minute
	}}
	ctx := context.Background()
	base := waitingBytes.Load()
	pool := func(body string) *request {
		req := newRequest(ctx, body)
		req.r = req.r.WithContext(context.WithValue(req.r.Context(), caddyhttp.VarsCtxKey, map[string]any{}))
		return req
	}

	a := pool(chatBody(1000, false)).start(h, next)
	require.Eventually(t, func() bool {
		next.mu.Lock()
		defer next.mu.Unlock()
		return len(next.calls) == 1 && engineOf(t, h).q.Stats().Waiting == 1
	}, 10*time.Second, time.Millisecond, "a is not refused and requeued")
	assert.Equal(t, base+1000+waitingHead(1000), waitingBytes.Load(), "a's body waits again")

	b := pool(chatBody(1000, false)).start(h, next).wait(t)
	require.NoError(t, b.err)
	assert.Equal(t, http.StatusTooManyRequests, b.w.Code)
	assert.Equal(t, "queue_full", b.w.Header().Get("Fair-Queue-Reason"), "b's body would take the waiting bodies to 2000 bytes")
	a.wait(t)
	assert.Equal(t, "timeout", a.w.Header().Get("Fair-Queue-Reason"), "a waited for the cooling upstream")
	assert.Equal(t, base, waitingBytes.Load(), "bytes left counted")
	settled(t, h)
}
