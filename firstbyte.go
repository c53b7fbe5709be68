package caddyfairqueue

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"time"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
)

// firstByteWriter passes an answer on unchanged and notes how long after
// the request was forwarded (forwarded, set at each forward) the first
// byte of its body came: the upstream's time to first byte, a stream's
// first event. An answer held back from the client (a requeue_on
// refusal), an error relayed as an event and a reject write nothing
// through it (call.beneath).
type firstByteWriter struct {
	caddyhttp.ResponseWriterWrapper // by value: one allocation per request
	forwarded                       time.Time
	upstream                        string        // the grant's pool upstream at the forward; "" without a pool
	first                           time.Duration // 0 until the first byte
	status                          int           // the answer's status, once written
	kind                            answerKind    // what the answer is, by its Content-Type, once its header came
	hijacked                        bool          // an upgrade (a WebSocket) took the connection
	heldBack                        bool          // the last forward's answer was held back (requeue_on): nothing of it timed
	errorAnswered                   bool          // the upstream answered an error status (300 and above): no first token to wait for
	unreached                       bool          // the forward never reached the upstream (unreached): no first token to wait for
	watch                           *hangupWatch  // the running request's watch, stopped by a hijack
}

// WriteHeader notes the answer's status.
func (f *firstByteWriter) WriteHeader(code int) {
	if code >= 200 {
		f.status = code
		f.errorAnswered = upstreamFailed(code)
		if code != statusClientClosedRequest { // reverse_proxy's note of a client that left, no answer's
			f.kind = answerKindOf(f.Header())
		}
	}
	f.ResponseWriter.WriteHeader(code)
}

// upstreamFailed reports whether status, written by the next handler,
// is an error the upstream answered: not a success, nor the 499 with
// which reverse_proxy notes a client that left before the answer.
func upstreamFailed(status int) bool {
	return failed(status) && status != statusClientClosedRequest
}

func newFirstByteWriter(w http.ResponseWriter) *firstByteWriter {
	return &firstByteWriter{ResponseWriterWrapper: caddyhttp.ResponseWriterWrapper{ResponseWriter: w}}
}

// forwardTo notes that the request is forwarded now, granted on
// upstream ("" without a pool): its first byte is timed from here.
func (f *firstByteWriter) forwardTo(upstream string) {
	f.forwarded, f.upstream, f.heldBack, f.errorAnswered, f.unreached = time.Now(), upstream, false, false, false
	f.kind = answerUnknown
}

func (f *firstByteWriter) Write(b []byte) (int, error) {
	if f.first == 0 && len(b) > 0 {
		f.first = max(time.Since(f.forwarded), time.Nanosecond)
	}
	return f.ResponseWriter.Write(b)
}

// ReadFrom copies through Write, so that the first byte is seen.
func (f *firstByteWriter) ReadFrom(r io.Reader) (int64, error) {
	if f.first != 0 {
		return f.ResponseWriterWrapper.ReadFrom(r)
	}
	return io.Copy(writerOnly{f}, r)
}

// FlushError implements the flusher of http.ResponseController. Once
// the connection is hijacked there is nothing to flush: net/http's
// writer beneath would panic.
func (f *firstByteWriter) FlushError() error {
	if f.hijacked {
		return http.ErrHijacked
	}
	return flush(f.ResponseWriter)
}

// Hijack hands the connection to reverse_proxy for an upgraded one (a
// WebSocket), and notes it. The tunnel sees its client's end itself, and
// a client's half-close there is no leaving (reverse_proxy passes it on
// and keeps the other way open): the running request's watch stops.
func (f *firstByteWriter) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	conn, brw, err := http.NewResponseController(f.ResponseWriter).Hijack()
	if err == nil {
		f.hijacked = true
		f.watch.stop()
	}
	return conn, brw, err
}

// Flush implements http.Flusher.
func (f *firstByteWriter) Flush() { _ = f.FlushError() }

// Interface guards
var (
	_ http.Flusher  = (*firstByteWriter)(nil)
	_ http.Hijacker = (*firstByteWriter)(nil)
)
