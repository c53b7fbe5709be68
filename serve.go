package caddyfairqueue

import (
	"cmp"
	"net/http"
	"time"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
)

// overflowQueue stands in logs and metrics for the name of a queue that
// a handler could not open (see maxQueuesPerHandler).
const overflowQueue = "(overflow)"

// Outcomes of a queued request, in the outcome placeholder, logs and
// metrics (a reject's outcome is its reason).
const (
	outcomeGranted   = "granted"
	outcomeFailOpen  = "fail_open"
	outcomeCancelled = "cancelled"
)

// abortGrace is the hold of an aborted request's permit in force.
func (h *Handler) abortGrace() time.Duration {
	if h.AbortGrace < 0 {
		return 0
	}
	return cmp.Or(time.Duration(h.AbortGrace), DefaultAbortGrace)
}

// ServeHTTP reads the request body, waits for a permit of the request's
// queue and calls next while holding it; or answers with a reject. The
// steps are call's.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler) error {
	if h.Tenant != "" && inEarlyData(r) {
		writeTooEarly(w, apiOf(r))
		return nil
	}
	c := &call{h: h, w: w, r: r, own: next}
	if answered, err := c.read(); answered {
		return err
	}
	if !h.serves(c.name) {
		return c.notServed()
	}
	if err := c.enter(); err != nil {
		return c.overflow(err)
	}
	defer c.finish()

	if err := c.wait(); err != nil {
		return c.notGranted(err)
	}
	if c.left() {
		// Granted as the client left (the grant raced its cancel, or it
		// left just after): forwarded, the request would run upstream
		// for nobody, beside the requests of live clients. The deferred
		// finish hands the permit to the next waiter as this returns.
		c.leftUnserved(c.permit.Waited(), c.permit.Position())
		return nil
	}
	return c.serve()
}

// inEarlyData reports whether r came in TLS early data (HTTP/3's 0-RTT):
// before the handshake that verifies its client. Caddy shows such a
// request no client address ({http.request.remote.host} is empty; its
// {client_ip} is unverified), so a tenant taken from the address would
// be the default tenant, every such request's, or an address the client
// chose; and early data may be replayed.
func inEarlyData(r *http.Request) bool {
	return r.TLS != nil && !r.TLS.HandshakeComplete
}
