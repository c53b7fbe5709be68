package caddyfairqueue

import (
	"net/http"
	"net/http/httptrace"
	"sync/atomic"
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

// stale reports whether the last forwarding went out on a kept-alive
// connection on which the upstream answered nothing: reverse_proxy's 502
// for it (a reset, an EOF) is that of a connection the upstream had
// dropped, not of a request it failed. Go's transport sends again only
// an idempotent request so (a POST is answered 502), as it cannot tell
// that the upstream read nothing of it; an upstream that read it and
// then died is taken for one too, and the request sent again finds it
// gone (a refused dial: it cools then).
func (ct *connTrace) stale() bool {
	return ct != nil && ct.reused.Load() && !ct.firstByte.Load()
}
