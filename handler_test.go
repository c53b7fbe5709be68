package caddyfairqueue

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fair-queue/caddy-fair-queue/internal/redistest"
)

// newContext returns a config-load context, cancelled when the test ends.
func newContext(t *testing.T) caddy.Context {
	t.Helper()
	ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
	t.Cleanup(cancel)
	return ctx
}

// provision provisions a handler on the Redis at addr in ctx, and
// cleans it up when the test ends.
func provision(t *testing.T, ctx caddy.Context, addr string, h *Handler) *Handler {
	t.Helper()
	if h.Redis == nil {
		h.Redis = &RedisConfig{Addresses: []string{addr}}
	}
	if h.PollInterval == 0 {
		h.PollInterval = caddy.Duration(50 * time.Millisecond)
	}
	require.NoError(t, h.Provision(ctx))
	t.Cleanup(func() { _ = h.Cleanup() })
	return h
}

// request is one request through a handler.
type request struct {
	w    *httptest.ResponseRecorder
	r    *http.Request
	repl *caddy.Replacer
	err  error
	done chan struct{}
}

func newRequest(ctx context.Context, body string, header ...string) *request {
	r := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", strings.NewReader(body)).WithContext(ctx)
	for i := 0; i+1 < len(header); i += 2 {
		r.Header.Set(header[i], header[i+1])
	}
	repl := caddyhttp.NewTestReplacer(r) // knows {http.request.*}
	c := context.WithValue(r.Context(), caddyhttp.ExtraLogFieldsCtxKey, new(caddyhttp.ExtraLogFields))
	return &request{w: httptest.NewRecorder(), r: r.WithContext(c), repl: repl, done: make(chan struct{})}
}

// start serves req through h in the background.
func (req *request) start(h *Handler, next caddyhttp.Handler) *request {
	go func() {
		defer close(req.done)
		req.err = h.ServeHTTP(req.w, req.r, next)
	}()
	return req
}

// wait waits until the request is answered.
func (req *request) wait(t *testing.T) *request {
	t.Helper()
	select {
	case <-req.done:
	case <-time.After(10 * time.Second):
		t.Fatal("request not answered within 10s")
	}
	return req
}

func (req *request) placeholder(key string) string {
	v, _ := req.repl.GetString(key)
	return v
}

// holder is a next handler that holds its permit until released.
type holder struct {
	entered chan struct{}
	release chan struct{}
	count   atomic.Int32
	once    sync.Once
}

// let releases the requests h holds and every later one (once; close
// h.release directly where let is not used).
func (h *holder) let() { h.once.Do(func() { close(h.release) }) }

// letAtCleanup lets each of hs go when t ends, if the test has not.
func letAtCleanup(t *testing.T, hs ...*holder) {
	t.Cleanup(func() {
		for _, h := range hs {
			h.let()
		}
	})
}

func newHolder() *holder {
	return &holder{entered: make(chan struct{}, 100), release: make(chan struct{})}
}

func (h *holder) ServeHTTP(w http.ResponseWriter, _ *http.Request) error {
	h.count.Add(1)
	h.entered <- struct{}{}
	<-h.release
	w.WriteHeader(http.StatusOK)
	return nil
}

func (h *holder) waitEntered(t *testing.T) {
	t.Helper()
	select {
	case <-h.entered:
	case <-time.After(10 * time.Second):
		t.Fatal("next handler not reached within 10s")
	}
}

var okHandler = caddyhttp.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) error {
	w.WriteHeader(http.StatusOK)
	return nil
})

// settled waits until every request that entered h's engines has exited:
// a permit's release runs after the answer (engine.finish).
func settled(t *testing.T, h *Handler) {
	t.Helper()
	require.Eventually(t, func() bool {
		for _, e := range h.engineList() {
			e.mu.Lock()
			n := e.active
			e.mu.Unlock()
			if n != 0 {
				return false
			}
		}
		return true
	}, 5*time.Second, time.Millisecond, "requests still running")
}

// poolEmpty asserts that no engine, Redis client or local store is left.
func poolEmpty(t *testing.T) {
	t.Helper()
	assert.Eventually(t, func() bool {
		n := 0
		engines.Range(func(_, _ any) bool { n++; return true })
		clients.Range(func(_, _ any) bool { n++; return true })
		localStores.Range(func(_, _ any) bool { n++; return true })
		return n == 0
	}, 5*time.Second, 10*time.Millisecond, "engines, clients or local stores left in the pools")
}

func TestHandlerQueuesBeyondPermitsAndHandsOverOnRelease(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	rds := redistest.Start(t)
	h := provision(t, newContext(t), rds.Addr(), &Handler{Permits: 1})
	next := newHolder()

	a := newRequest(context.Background(), `{"model":"m"}`).start(h, next)
	next.waitEntered(t)
	assert.Equal(t, "granted", a.placeholder(phOutcome))
	assert.Equal(t, "0", a.placeholder(phPosition), "granted at once")
	assert.Equal(t, "m", a.placeholder(phModel))
	assert.Equal(t, "default", a.placeholder(phQueue))

	b := newRequest(context.Background(), `{"model":"m"}`).start(h, next)
	select {
	case <-next.entered:
		t.Fatal("second request passed while the only permit was held")
	case <-time.After(300 * time.Millisecond):
	}

	next.release <- struct{}{} // a finishes
	a.wait(t)
	next.waitEntered(t) // b gets the permit
	next.release <- struct{}{}
	b.wait(t)

	require.NoError(t, b.err)
	assert.Equal(t, http.StatusOK, b.w.Code)
	assert.Equal(t, "granted", b.placeholder(phOutcome))
	assert.Equal(t, "1", b.placeholder(phPosition), "b was next in line")
	waited, _ := b.repl.GetString(phWaitMS)
	assert.NotEqual(t, "0", waited)
}

func TestHandlerRejectsAfterMaxWaitWithJSONOrSSE(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	rds := redistest.Start(t)
	h := provision(t, newContext(t), rds.Addr(), &Handler{Permits: 1, MaxWait: caddy.Duration(300 * time.Millisecond)})
	next := newHolder()
	a := newRequest(context.Background(), ``).start(h, next)
	next.waitEntered(t)
	defer func() { close(next.release); a.wait(t) }()

	plain := newRequest(context.Background(), `{"model":"m"}`).start(h, next).wait(t)
	require.NoError(t, plain.err)
	assert.Equal(t, http.StatusTooManyRequests, plain.w.Code)
	assert.Equal(t, "timeout", plain.w.Header().Get("Fair-Queue-Reason"))
	assert.NotEmpty(t, plain.w.Header().Get("Retry-After"))
	var body apiError
	require.NoError(t, json.Unmarshal(plain.w.Body.Bytes(), &body))
	assert.Equal(t, "timeout", body.Error.Code)
	assert.Equal(t, "timeout", plain.placeholder(phOutcome))
	assert.Equal(t, "timeout", plain.placeholder(phReason))

	streaming := newRequest(context.Background(), `{"model":"m","stream":true}`).start(h, next).wait(t)
	assert.Equal(t, http.StatusOK, streaming.w.Code)
	assert.Equal(t, "text/event-stream", streaming.w.Header().Get("Content-Type"))
	assert.True(t, strings.HasPrefix(streaming.w.Body.String(), "event: error\ndata: {"), streaming.w.Body.String())

	byAccept := newRequest(context.Background(), ``, "Accept", "text/event-stream").start(h, next).wait(t)
	assert.Equal(t, "text/event-stream", byAccept.w.Header().Get("Content-Type"))
	assert.Equal(t, int32(1), next.count.Load(), "no rejected request reached the next handler")
}

func TestHandlerDropsWaiterWhoseClientLeft(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	rds := redistest.Start(t)
	h := provision(t, newContext(t), rds.Addr(), &Handler{Permits: 1})
	next := newHolder()
	a := newRequest(context.Background(), ``).start(h, next)
	next.waitEntered(t)

	ctx, cancel := context.WithCancel(context.Background())
	b := newRequest(ctx, `{}`).start(h, next)
	time.Sleep(100 * time.Millisecond) // b is queued
	cancel()
	b.wait(t)
	require.NoError(t, b.err)
	assert.Zero(t, b.w.Body.Len(), "nothing is written to a client that left")
	assert.Equal(t, "cancelled", b.placeholder(phOutcome))

	next.release <- struct{}{}
	a.wait(t)
	settled(t, h)
	c := newRequest(context.Background(), ``).start(h, next)
	next.waitEntered(t)
	assert.Equal(t, "0", c.placeholder(phPosition), "the permit went to c at once, not to b who left")
	next.release <- struct{}{}
	c.wait(t)
}

func TestHandlerUpstreamReceivesTheSameBodyAndLength(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	rds := redistest.Start(t)
	h := provision(t, newContext(t), rds.Addr(), &Handler{Permits: 1})

	var gotBody []byte
	var gotLength string
	var gotTE []string
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		gotBody, _ = io.ReadAll(r.Body)
		gotLength = r.Header.Get("Content-Length")
		gotTE = r.TransferEncoding
	}))
	defer upstream.Close()
	u, _ := url.Parse(upstream.URL)
	proxy := httputil.NewSingleHostReverseProxy(u)
	next := caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
		proxy.ServeHTTP(w, r)
		return nil
	})

	payload := `{"messages":[{"role":"user","content":"` + strings.Repeat("é", 300<<10) + `"}],"stream":false,"model":"m"}`
	req := newRequest(context.Background(), "")
	req.r.Body = io.NopCloser(io.MultiReader(strings.NewReader(payload))) // length unknown, as with chunked uploads
	req.r.ContentLength = -1
	req.r.TransferEncoding = []string{"chunked"}
	req.start(h, next).wait(t)

	require.NoError(t, req.err)
	assert.Equal(t, http.StatusOK, req.w.Code)
	assert.True(t, bytes.Equal([]byte(payload), gotBody), "upstream got %d bytes, want %d", len(gotBody), len(payload))
	assert.Equal(t, itoa(len(payload)), gotLength)
	assert.Empty(t, gotTE, "sent with a Content-Length, not chunked")
}

func TestHandlerAnswersTooLargeBodyWith413BeforeQueueing(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	// No Redis: a body that is too large never reaches the queue.
	h := provision(t, newContext(t), "127.0.0.1:1", &Handler{Permits: 1, MaxBody: 1024})
	for _, size := range []int{1025, 1 << 20} {
		req := newRequest(context.Background(), strings.Repeat("a", size)).start(h, okHandler).wait(t)
		require.NoError(t, req.err)
		assert.Equal(t, http.StatusRequestEntityTooLarge, req.w.Code)
		assert.Equal(t, "application/json", req.w.Header().Get("Content-Type"))
		var body apiError
		require.NoError(t, json.Unmarshal(req.w.Body.Bytes(), &body))
		assert.Equal(t, "request_too_large", body.Error.Code)
		assert.Contains(t, body.Error.Message, "1 KiB")
	}
}

func TestHandlerStoreErrorPolicy(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	down := deadAddr(t)

	closed := provision(t, newContext(t), down, &Handler{Name: "closed", Permits: 1, OnStoreError: FailClosed})
	req := newRequest(context.Background(), `{}`).start(closed, okHandler).wait(t)
	assert.Equal(t, http.StatusServiceUnavailable, req.w.Code)
	assert.Equal(t, "store_unavailable", req.w.Header().Get("Fair-Queue-Reason"))
	sse := newRequest(context.Background(), `{"stream":true}`).start(closed, okHandler).wait(t)
	assert.Equal(t, "text/event-stream", sse.w.Header().Get("Content-Type"))

	open := provision(t, newContext(t), down, &Handler{Name: "open", Permits: 1})
	reached := 0
	for range 3 {
		req := newRequest(context.Background(), `{}`).start(open, caddyhttp.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) error {
			reached++
			return nil
		})).wait(t)
		require.NoError(t, req.err)
		assert.Equal(t, "fail_open", req.placeholder(phOutcome))
		assert.Equal(t, "store_unavailable", req.placeholder(phReason))
	}
	assert.Equal(t, 3, reached, "fail_open admits every request while Redis is down")
}

func TestQueuePerModelFromPlaceholder(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	rds := redistest.Start(t)
	h := provision(t, newContext(t), rds.Addr(), &Handler{Name: "llm-{http.fair_queue.model}", Permits: 1})
	assert.Empty(t, h.engineList(), "queues named per request open at request time")
	next := newHolder()

	a := newRequest(context.Background(), `{"model":"a"}`).start(h, next)
	next.waitEntered(t)
	b := newRequest(context.Background(), `{"model":"b"}`).start(h, next)
	next.waitEntered(t) // another queue: not blocked by a
	assert.Equal(t, "llm-a", a.placeholder(phQueue))
	assert.Equal(t, "llm-b", b.placeholder(phQueue))
	assert.Len(t, h.engineList(), 2)

	long := newRequest(context.Background(), `{"model":"`+strings.Repeat("x", maxQueueNameLen)+`"}`).start(h, next).wait(t)
	assert.Equal(t, http.StatusTooManyRequests, long.w.Code)
	assert.Equal(t, "queue_full", long.w.Header().Get("Fair-Queue-Reason"))

	next.release <- struct{}{}
	next.release <- struct{}{}
	a.wait(t)
	b.wait(t)
}

// deadAddr returns an address where nothing listens.
func deadAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	ln.Close()
	return addr
}

func TestHandlerNeverRunsMoreThanPermitsAtOnce(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	rds := redistest.Start(t)
	h := provision(t, newContext(t), rds.Addr(), &Handler{Permits: 3})
	var running, peak atomic.Int32
	next := caddyhttp.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) error {
		n := running.Add(1)
		for p := peak.Load(); n > p && !peak.CompareAndSwap(p, n); p = peak.Load() {
		}
		time.Sleep(20 * time.Millisecond)
		running.Add(-1)
		return nil
	})
	var reqs []*request
	for range 30 {
		reqs = append(reqs, newRequest(context.Background(), `{"stream":true}`).start(h, next))
	}
	for _, r := range reqs {
		r.wait(t)
		require.NoError(t, r.err)
		assert.Equal(t, "granted", r.placeholder(phOutcome))
	}
	assert.Equal(t, int32(3), peak.Load(), "at most (and, under load, exactly) the permits run at once")
}
