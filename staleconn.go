package caddyfairqueue

import (
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"strings"
	"sync/atomic"
	"syscall"
)

// reasonStale is the requeue reason of a request sent on a kept-alive
// connection that the upstream dropped before answering anything: one
// it closed as it went idle, just as the request was written on it.
const reasonStale = "stale_connection"

// connTrace follows the connection each forwarding of a pool's request
// goes out on (reverse_proxy's transport, through the request's
// context): whether it was a kept-alive one, and whether the upstream
// answered anything on it.
type connTrace struct {
	reused    atomic.Bool // the last forwarding went out on a kept-alive connection
	firstByte atomic.Bool // the upstream answered something on it
	resent    bool        // stale reported one already (the serving goroutine's)
}

// traceConns has the transport report the connections of r's
// forwardings to a new connTrace (r's context, in place, as cancelable
// does).
func traceConns(r *http.Request) *connTrace {
	ct := &connTrace{}
	trace := &httptrace.ClientTrace{
		GotConn:              func(i httptrace.GotConnInfo) { ct.reused.Store(i.Reused) },
		GotFirstResponseByte: func() { ct.firstByte.Store(true) },
	}
	*r = *r.WithContext(httptrace.WithClientTrace(r.Context(), trace))
	return ct
}

// forwarding starts the account of a new forwarding.
func (ct *connTrace) forwarding() {
	if ct != nil {
		ct.reused.Store(false)
		ct.firstByte.Store(false)
	}
}

// stale reports whether the last forwarding, which failed with err, went
// out on a kept-alive connection on which the upstream answered nothing,
// and the connection ended (an EOF, a reset: errDropped): reverse_proxy's
// 502 for it is that of a connection the upstream had dropped, not of a
// request it failed. Go's transport sends again only an idempotent
// request so (a POST is answered 502), as it cannot tell that the
// upstream read nothing of it: neither can this. An upstream that read
// it and then died (a worker killed mid-request) is taken for one too,
// once: stale reports true once for a request, so that it is sent again
// once at most, and a second such failure is the upstream's (it cools).
// An HTTP/2 stream that the upstream reset is none: an upstream closes
// an idle HTTP/2 connection with a GOAWAY, whose unprocessed streams
// the transport sends again itself.
func (ct *connTrace) stale(err error) bool {
	if ct == nil || ct.resent || !ct.reused.Load() || ct.firstByte.Load() || !errDropped(err) {
		return false
	}
	ct.resent = true
	return true
}

// errDropped reports whether err is that of an HTTP/1 connection the
// upstream closed (an EOF, a reset, a broken pipe, or the transport's
// "server closed idle connection"), not an HTTP/2 stream's reset nor a
// lost HTTP/2 connection (an unexpected EOF), nor a timeout. A request
// whose body was still being written when the transport's reader saw
// the upstream end the connection fails with the write on the
// connection the reader closed (net.ErrClosed, which Go's transport
// reports as the body's read error, in place of the reset); so does the
// reader, the other way round.
func errDropped(err error) bool {
	return err != nil && (errors.Is(err, io.EOF) || errors.Is(err, syscall.ECONNRESET) ||
		errors.Is(err, syscall.EPIPE) || errors.Is(err, net.ErrClosed) ||
		strings.Contains(err.Error(), "server closed idle connection"))
}
