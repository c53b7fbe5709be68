package caddyfairqueue

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/http"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
)

// Waiting feedback for streaming clients (sse_keepalive): a proxy or CDN
// between the client and Caddy cuts a response that stays silent too
// long, so a streaming request that waits in the queue gets its 200
// text/event-stream header early and an SSE comment every interval.
// From then on the response is an event stream whatever happens: the
// upstream's events, an upstream error or a reject all become events.

// minSSEKeepalive is the shortest sse_keepalive interval.
const minSSEKeepalive = 100 * time.Millisecond

// maxUpstreamErrorBody bounds the error body of an upstream that the
// relay turns into an SSE error event; a longer one is replaced by the
// default error object.
const maxUpstreamErrorBody = 64 << 10

// waitStatus is what a waiting request knows of its place in the queue
// (fairqueue.Waiting): position and eta are unknown (0) until the ticket
// is queued and, for eta, until the queue's drain rate is known.
type waitStatus struct {
	position int           // tickets ahead plus one; 0: unknown
	eta      time.Duration // estimated wait left; 0: unknown
	waited   time.Duration
}

// queueEventData is the data of the SSE queue event; unknown values are
// null, so that the shape stays the same when the engine learns them.
type queueEventData struct {
	Position *int `json:"position"`
	ETA      *int `json:"eta_s"`
	Waited   int  `json:"waited_s"`
}

// comment is the SSE comment for st, such as ": queued waited=12s".
func (st waitStatus) comment() []byte {
	var b bytes.Buffer
	b.WriteString(": queued")
	if st.position > 0 {
		fmt.Fprintf(&b, " position=%d", st.position)
	}
	if st.eta > 0 {
		fmt.Fprintf(&b, " eta=%ds", ceilSeconds(st.eta))
	}
	fmt.Fprintf(&b, " waited=%ds\n\n", int(st.waited.Seconds()))
	return b.Bytes()
}

// event is the SSE queue event for st (sse_queue_events).
func (st waitStatus) event() []byte {
	d := queueEventData{Waited: int(st.waited.Seconds())}
	if st.position > 0 {
		d.Position = &st.position
	}
	if st.eta > 0 {
		eta := ceilSeconds(st.eta)
		d.ETA = &eta
	}
	data, _ := json.Marshal(d)
	return sseEvent("queue", string(data))
}

func ceilSeconds(d time.Duration) int { return int(math.Ceil(d.Seconds())) }

// keepalive feeds one waiting streaming client from its own goroutine.
// The handler's goroutine blocks in Acquire meanwhile and does not touch
// the response until halt has returned, so the two never write at once
// and need no lock.
type keepalive struct {
	w        http.ResponseWriter
	interval time.Duration
	events   bool
	start    time.Time // when the request joined the queue
	stop     chan struct{}
	done     chan struct{}
	// committed: the header is sent. Written by run, read by halt after
	// done is closed.
	committed bool
	queued    chan fairqueue.Waiting // the ticket's live view, once queued
	view      *fairqueue.Waiting     // received from queued; run's only
}

// keepaliveFeed hands the ticket's live view (Request.OnQueued) to the
// keepalive of the wait in progress: a requeued request waits again with
// a new keepalive, and the queue calls the request's OnQueued again.
type keepaliveFeed struct{ cur atomic.Pointer[keepalive] }

// newKeepaliveFeed feeds k; nil (no OnQueued) when k is nil.
func newKeepaliveFeed(k *keepalive) *keepaliveFeed {
	if k == nil {
		return nil
	}
	f := new(keepaliveFeed)
	f.cur.Store(k)
	return f
}

// onQueued is the request's OnQueued; nil for a nil feed.
func (f *keepaliveFeed) onQueued() func(fairqueue.Waiting) {
	if f == nil {
		return nil
	}
	return f.offer
}

// offer passes w on without blocking: one view per wait, and a halted
// keepalive takes none.
func (f *keepaliveFeed) offer(w fairqueue.Waiting) {
	if k := f.cur.Load(); k != nil {
		select {
		case k.queued <- w:
		default:
		}
	}
}

// use feeds k (a wait's new keepalive) from now on.
func (f *keepaliveFeed) use(k *keepalive) {
	if f != nil {
		f.cur.Store(k)
	}
}

// startKeepalive starts feeding w while the request, queued at start,
// waits, when the request streams and sse_keepalive is set; otherwise it
// returns nil (whose halt is a no-op). committed: the header is sent
// already (a requeued request's second wait).
func (h *Handler) startKeepalive(w http.ResponseWriter, streaming bool, start time.Time, committed bool) *keepalive {
	if !streaming || h.SSEKeepalive <= 0 {
		return nil
	}
	k := &keepalive{
		w:        w,
		interval: time.Duration(h.SSEKeepalive),
		events:   h.SSEQueueEvents,
		start:    start,
		stop:     make(chan struct{}),
		done:     make(chan struct{}),
		queued:   make(chan fairqueue.Waiting, 1),

		committed: committed,
	}
	go k.run()
	return k
}

func (k *keepalive) run() {
	defer close(k.done)
	tick := time.NewTicker(k.interval)
	defer tick.Stop()
	for {
		select {
		case <-k.stop:
			return
		case <-tick.C:
		}
		if err := k.send(); err != nil {
			return // the client is gone: Acquire sees it through the context
		}
	}
}

// send commits the response on its first call, then writes the comment
// (and the queue event when asked for) and flushes.
func (k *keepalive) send() error {
	if !k.committed {
		hd := k.w.Header()
		hd.Set("Content-Type", "text/event-stream")
		hd.Set("Cache-Control", "no-cache")
		hd.Set("X-Accel-Buffering", "no") // nginx: do not buffer the stream
		hd.Del("Content-Length")
		k.w.WriteHeader(http.StatusOK)
		k.committed = true
	}
	st := waitStatus{waited: time.Since(k.start)}
	select {
	case v := <-k.queued:
		k.view = &v
	default:
	}
	if k.view != nil {
		st.position, st.eta = k.view.Position(), k.view.ETA()
	}
	b := st.comment()
	if k.events {
		b = append(b, st.event()...)
	}
	if _, err := k.w.Write(b); err != nil {
		return err
	}
	return flush(k.w)
}

// halt stops the keepalive and waits for its goroutine to end, so that
// the caller is the response's only writer again. It reports whether the
// response's header was sent: then only SSE events may follow.
func (k *keepalive) halt() (committed bool) {
	if k == nil {
		return false
	}
	close(k.stop)
	<-k.done
	return k.committed
}

// relay serves a granted request whose response the keepalive already
// committed: the upstream's status and header are gone, its body is
// relayed as it comes, and an error (an error status, or the next
// handler failing before it wrote anything) becomes an SSE error event.
func (h *Handler) relay(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler, name string) error {
	cw := &committedWriter{w: w, header: make(http.Header)}
	return h.relayEnd(w, cw, next.ServeHTTP(cw, r), name)
}

// relayEnd ends a relayed answer that cw holds, next's error err.
func (h *Handler) relayEnd(w http.ResponseWriter, cw *committedWriter, err error, name string) error {
	status := cw.status
	if err != nil {
		status = http.StatusBadGateway
		if he, ok := errors.AsType[caddyhttp.HandlerError](err); ok && he.StatusCode != 0 {
			status = he.StatusCode
		}
		level := zapcore.DebugLevel
		if status >= 500 {
			level = zapcore.ErrorLevel
		}
		if c := h.logger.Check(level, "upstream failed after the stream was committed"); c != nil {
			c.Write(zap.String("queue", name), zap.Int("status", status), zap.Error(err))
		}
		if cw.wrote {
			return nil // an event may be half written: end the stream
		}
	}
	if status < http.StatusBadRequest {
		return flush(w)
	}
	_ = writeEvent(w, "error", string(upstreamError(status, cw.errBody.Bytes()))) // fails only when the client is gone
	return nil
}

// upstreamError is the data of the SSE error event for an upstream's
// error answer: its body when that is JSON (on one line), else the
// default error object.
func upstreamError(status int, body []byte) []byte {
	body = bytes.TrimSpace(body)
	if len(body) > 0 && len(body) <= maxUpstreamErrorBody && json.Valid(body) {
		var b bytes.Buffer
		if json.Compact(&b, body) == nil {
			return b.Bytes()
		}
	}
	typ := "invalid_request_error"
	switch {
	case status == http.StatusTooManyRequests:
		typ = "rate_limit_exceeded"
	case status >= 500:
		typ = "server_error"
	}
	msg := "The upstream server answered with status " + strconv.Itoa(status)
	if text := http.StatusText(status); text != "" {
		msg += " " + text
	}
	return marshalError(msg+".", typ, "upstream_error")
}

// committedWriter is the next handler's ResponseWriter once the header
// of the response is sent: it keeps the upstream's header and status to
// itself, relays a successful body with a flush after every write, and
// holds an error body back for the SSE error event. It hides the
// writer beneath (no Unwrap), so that nothing hijacks or re-heads a
// stream that is already running.
type committedWriter struct {
	w       http.ResponseWriter
	header  http.Header // the upstream's, never sent
	status  int         // the upstream's; 0 until known
	errBody bytes.Buffer
	wrote   bool // body bytes reached the client
}

func (cw *committedWriter) Header() http.Header { return cw.header }

// WriteHeader records the upstream's status; informational ones (103
// Early Hints) are dropped.
func (cw *committedWriter) WriteHeader(code int) {
	if code >= 200 && cw.status == 0 {
		cw.status = code
	}
}

func (cw *committedWriter) Write(b []byte) (int, error) {
	if cw.status == 0 {
		cw.status = http.StatusOK
	}
	if cw.status >= http.StatusBadRequest {
		if room := maxUpstreamErrorBody + 1 - cw.errBody.Len(); room > 0 {
			cw.errBody.Write(b[:min(len(b), room)])
		}
		return len(b), nil
	}
	n, err := cw.w.Write(b)
	if n > 0 {
		cw.wrote = true
	}
	if err != nil {
		return n, err
	}
	return n, flush(cw.w)
}

// FlushError implements the flusher of http.ResponseController.
func (cw *committedWriter) FlushError() error {
	if cw.status >= http.StatusBadRequest {
		return nil
	}
	return flush(cw.w)
}
