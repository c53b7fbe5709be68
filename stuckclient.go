package caddyfairqueue

import (
	"net/http"
	"time"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
)

// A client that reads nothing (an HTTP/2 stream whose flow-control
// window it leaves at 0, or full TCP buffers) blocks every flush to it.
// The queue's own writes to a waiting request (the keepalive's comments,
// a reject) are bounded, so that such a client cannot hold its request,
// and the request's queue among the handler's queues, past max_wait:
// the queue gives up on a frame the client has not taken within
// frameTimeout. A healthy client takes these few bytes at once: they
// fit the smallest window and socket buffer. A keepalive comment not
// taken in time also ends the request's wait: the request leaves the
// queue as if its client had gone (keepalive.sendWithin).

// frameTimeout bounds a write of the queue's own frame to a client.
const frameTimeout = time.Second

// boundWrites gives the writes to w until frameTimeout from now (or
// until the server's own write deadline, server, if that is sooner),
// where w supports write deadlines, and returns what lifts the bound:
// it puts the server's deadline back (zero: none), so that the rest of
// the response keeps the server's write_timeout, and the connection may
// serve on (an HTTP/1 connection keeps a deadline into its next
// request).
func boundWrites(w http.ResponseWriter, server time.Time) (lift func()) {
	return boundWritesThen(w, server, func() time.Time { return server })
}

// boundLastWrites is boundWrites for the last frame the handler writes
// to r's answer (a reject, an error event), after which its handler
// returns: the lift puts back the deadline that Caddy's write_idle_timeout
// would have left (lastFlushDeadline), which bounds the flush Go's
// server makes after the handler returns.
func boundLastWrites(w http.ResponseWriter, r *http.Request) (lift func()) {
	server := serverWriteDeadline(r)
	return boundWritesThen(w, server, func() time.Time { return lastFlushDeadline(r, server) })
}

// boundWritesThen bounds the writes to w as boundWrites does; its lift
// sets the write deadline to what back returns.
func boundWritesThen(w http.ResponseWriter, server time.Time, back func() time.Time) (lift func()) {
	rc := http.NewResponseController(w)
	bound := time.Now().Add(frameTimeout)
	if !server.IsZero() && server.Before(bound) {
		bound = server
	}
	if rc.SetWriteDeadline(bound) != nil {
		return func() {}
	}
	return func() { _ = rc.SetWriteDeadline(back()) }
}

// lastFlushDeadline is the write deadline to leave on r's connection
// (stream) after the handler's last write, server being the server's
// own. Go's HTTP/1 server and quic-go's HTTP/3 one flush what the
// handler left buffered (a plain answer's body, an HTTP/1 chunked
// stream's terminator) after the handler returns, under the deadline in
// force then: a client whose window shuts just then would hold the
// connection or stream, and its goroutine, for as long as it keeps its
// connection open, were there none. Caddy's write_idle_timeout
// (IdleTimeoutWriter) leaves one after each write of an answer over
// these, the timeout from then, within the server's write_timeout (its
// HardDeadline, which over HTTP/3 is the only place write_timeout
// applies): that one, so that the flush after the queue's frame is
// bounded as any answer's last flush is, and an HTTP/1 connection's next
// request finds the deadline that any answer leaves it. Over HTTP/2 that
// writer arms the flush's deadline itself as the handler returns (a
// deadline left armed there resets the stream when it passes), and
// without write_idle_timeout Caddy leaves none: server.
func lastFlushDeadline(r *http.Request, server time.Time) time.Time {
	if r.ProtoMajor == 2 {
		return server
	}
	_, idle := caddyhttp.IdleTimeoutsFromContext(r.Context())
	if idle == nil || idle.Deadline.Timeout <= 0 {
		return server
	}
	d := time.Now().Add(idle.Deadline.Timeout)
	for _, ceiling := range []time.Time{server, idle.Deadline.HardDeadline} {
		if !ceiling.IsZero() && ceiling.Before(d) {
			d = ceiling
		}
	}
	return d
}

// serverWriteDeadline is the write deadline the server set for r's
// response, which a deadline of the handler's own replaces: Caddy's
// write_timeout from when it began the request, over HTTP/1 and HTTP/2;
// zero without one, and over HTTP/3, where Caddy sets none (its
// write_idle_timeout, when on, applies write_timeout at each write
// itself).
func serverWriteDeadline(r *http.Request) time.Time {
	srv, ok := r.Context().Value(caddyhttp.ServerCtxKey).(*caddyhttp.Server)
	if !ok || srv.WriteTimeout <= 0 || r.ProtoMajor > 2 {
		return time.Time{}
	}
	start, ok := caddyhttp.GetVar(r.Context(), "start_time").(time.Time)
	if !ok {
		start = time.Now()
	}
	return start.Add(time.Duration(srv.WriteTimeout))
}
