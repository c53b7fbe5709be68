package caddyfairqueue

import (
	"bytes"
	"errors"
	"io"
	"math"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"time"
)

// bodyChunk is the most readBody allocates for a body before its bytes
// arrive, whatever length the client declared: the buffer grows with the
// bytes received, so that a client that declares a large body and sends
// a few bytes costs a few bytes. It is small: each HTTP/2 or HTTP/3
// stream reading a body holds one (hundreds on one connection), and a
// body of 8 MiB costs 11 doublings more from it than from 64 KiB.
const bodyChunk = 4 << 10

// minBodyTimeout is the shortest body_timeout.
const minBodyTimeout = 100 * time.Millisecond

// errBodyTimeout: the body did not arrive within body_timeout.
var errBodyTimeout = errors.New("request body not received within body_timeout")

// readBody reads the whole request body, at most limit bytes within
// timeout, and puts the same bytes back for the handlers after this one
// (reverse_proxy sends them upstream with a known Content-Length).
//
// Reading first matters: Go's HTTP/1.1 server notices that a client went
// away only once the handler has read the request body to EOF, so a
// queued request with an unread body would hold its place, and later a
// permit, for nobody. A body larger than limit gives an
// *http.MaxBytesError; one that does not arrive within timeout,
// errBodyTimeout (the connection is then unusable: answer it and let it
// close).
//
// A CONNECT's body is not read: it is the client's side of a tunnel (a
// WebSocket over HTTP/2 or HTTP/3, RFC 8441 and 9220), open until the
// tunnel closes.
func readBody(w http.ResponseWriter, r *http.Request, limit int64, timeout time.Duration) ([]byte, error) {
	if r.Body == nil || r.Body == http.NoBody || r.Method == http.MethodConnect {
		return nil, nil
	}
	if r.ContentLength > limit {
		return nil, &http.MaxBytesError{Limit: limit}
	}
	// A body declared empty (Caddy's access log wraps even that one, to
	// count its bytes) is read at once: it gets no deadline. Over HTTP/1
	// Go's server already watches its connection for a client that
	// leaves (a read in the background), and a deadline set there would
	// end that read, and the request, when it passed.
	var d *bodyDeadline
	if r.ContentLength != 0 {
		d = startBodyDeadline(w, r.Body, timeout)
	}
	// MaxBytesReader also tells the server to close the connection
	// after the answer, rather than read the rest of a huge body.
	b, err := readGrowing(http.MaxBytesReader(w, r.Body, limit), r.ContentLength, limit)
	if err != nil {
		if d.expired(err) {
			return nil, errBodyTimeout
		}
		return nil, err
	}
	d.lift(r)
	if cap(b)-len(b) > len(b)/8 {
		// The buffer of a body of unknown length starts at bodyChunk
		// and doubles: it may be far larger than the body, which waits
		// counted at its length against max_waiting_bytes. Keep only
		// the body.
		b = append(make([]byte, 0, len(b)), b...)
	}
	r.Body = io.NopCloser(bytes.NewReader(b))
	r.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(b)), nil }
	r.ContentLength = int64(len(b))
	r.TransferEncoding = nil
	r.Header.Set("Content-Length", strconv.Itoa(len(b)))
	return b, nil
}

// readGrowing reads src to EOF into a buffer that grows as bytes
// arrive: it starts at no more than bodyChunk and doubles when full, up
// to room for the declared length (-1: unknown) or limit, plus one byte
// for the read that finds EOF, so that a body of the declared length
// never needs a larger buffer than itself.
func readGrowing(src io.Reader, declared, limit int64) ([]byte, error) {
	bound := limit
	if declared >= 0 {
		bound = declared
	}
	bound = min(bound, math.MaxInt64-1) + 1 // the EOF read
	b := make([]byte, 0, min(bound, bodyChunk))
	for {
		if len(b) == cap(b) {
			size := min(2*int64(cap(b)), bound)
			if size <= int64(cap(b)) { // more than declared: not from net/http
				size = 2 * int64(cap(b))
			}
			b = append(make([]byte, 0, size), b...)
		}
		n, err := src.Read(b[len(b):cap(b)])
		b = b[:len(b)+n]
		if err == io.EOF {
			return b, nil
		}
		if err != nil {
			return nil, err
		}
	}
}

// bodyDeadline bounds the read of a request body: a read deadline on the
// connection (HTTP/1, HTTP/2 and HTTP/3 all take one; with Caddy's read
// idle timeout it caps that one), or, for a ResponseWriter that cannot
// set one, a timer that closes the body. A nil one is none (a body
// declared empty).
type bodyDeadline struct {
	rc    *http.ResponseController // nil: the timer
	timer *time.Timer
	fired atomic.Bool
}

func startBodyDeadline(w http.ResponseWriter, body io.Closer, timeout time.Duration) *bodyDeadline {
	d := &bodyDeadline{rc: http.NewResponseController(w)}
	if d.rc.SetReadDeadline(time.Now().Add(timeout)) == nil {
		return d
	}
	d.rc = nil
	d.timer = time.AfterFunc(timeout, func() {
		d.fired.Store(true)
		_ = body.Close()
	})
	return d
}

// expired reports whether err, the failed read of the body, is the
// deadline's doing. The deadline stays: an expired one makes the
// server close the connection at once rather than wait for the rest of
// the body.
func (d *bodyDeadline) expired(err error) bool {
	if d == nil {
		return false
	}
	if d.timer != nil {
		d.timer.Stop()
	}
	return errors.Is(err, os.ErrDeadlineExceeded) || d.fired.Load()
}

// lift removes the deadline once the body is read: the response, a
// stream perhaps, may last much longer. Over HTTP/1 there is nothing to
// lift, and nothing may be set: Go's server cleared the connection's
// deadline itself at the body's end, and now watches the connection for
// a client that leaves (a read in the background); a deadline set there
// ends that read and cancels the request as if its client had gone.
// Caddy's read idle timeout, asked to clear the deadline, sets the
// server's read_timeout instead, so that with one configured every
// request that waited or ran longer than that was cancelled. (Over
// HTTP/2 and HTTP/3 the deadline is the stream's, and a deadline left
// behind would be a trap for whatever reads or sets it next.)
func (d *bodyDeadline) lift(r *http.Request) {
	if d == nil {
		return
	}
	if d.timer != nil {
		d.timer.Stop()
		return
	}
	if r.ProtoMajor == 1 {
		return
	}
	_ = d.rc.SetReadDeadline(time.Time{})
}

// wantsEventStream reports whether the client asked for server-sent
// events in its Accept header.
func wantsEventStream(r *http.Request) bool {
	for _, v := range r.Header.Values("Accept") {
		if strings.Contains(strings.ToLower(v), "text/event-stream") {
			return true
		}
	}
	return false
}
