package caddyfairqueue

import (
	"errors"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
)

// waitingBytes is what requests waiting for a permit in this process
// hold, each counted as waitingSize: every fair_queue handler and
// every queue together, since they share the process's memory (see
// Handler.MaxWaitingBytes).
var waitingBytes atomic.Int64

// headerFieldCost is what each header field of a request costs in
// memory beyond its name and value (its map entry and slice).
const headerFieldCost = 64

// waiterCost is what a waiting request holds in memory beyond its body
// and head, whatever they are: its goroutines' stacks, its connection's
// buffers (HTTP/1) or stream's, Caddy's state of the request, the
// queue's ticket (measured: 38 KiB over HTTP/1). max_queue has no
// default, so that max_waiting_bytes is what bounds how many requests
// wait: a request of `{}` counted as its 100 bytes would let millions
// wait within the default 256 MiB.
const waiterCost = 32 << 10

// waitingSize is what a request holds in memory while it waits:
// waiterCost, its body of bodyLen bytes, its target, and its header and
// trailer fields, each its name, its value and headerFieldCost. A
// client's headers (up to the server's max_header_bytes) cost as much as
// a body of that size, and count as one; so do its trailers (over
// HTTP/2 and HTTP/3 as many bytes again, read with the body).
func waitingSize(r *http.Request, bodyLen int) int64 {
	n := waiterCost + int64(bodyLen) + int64(len(r.RequestURI)+len(r.URL.Path)+len(r.URL.RawQuery)+len(r.Host))
	return n + fieldsSize(r.Header) + trailersSize(r)
}

// trailersSize is what r's trailer fields hold. Over HTTP/1 they are in
// r.Trailer once the body is read (those it did not announce, 4 KiB at
// most, are not). Over HTTP/2 the server keeps every field of a request
// that announced trailers and shows r.Trailer only those it announced;
// one that announced none has the rest dropped. Over HTTP/3 the server
// keeps them on its own copy of the request, announced or not, and
// r.Trailer holds only the names announced. A request whose trailers
// the handler cannot see (HTTP/2 that announced some, HTTP/3 whose body
// is read: all but a CONNECT) is counted at the server's
// max_header_bytes, the most they may hold.
func trailersSize(r *http.Request) int64 {
	n := fieldsSize(r.Trailer)
	unseen := r.ProtoMajor == 3 || r.ProtoMajor == 2 && len(r.Trailer) > 0
	if !unseen || r.Method == http.MethodConnect {
		return n
	}
	limit := int64(http.DefaultMaxHeaderBytes)
	if srv, ok := r.Context().Value(caddyhttp.ServerCtxKey).(*caddyhttp.Server); ok && srv.MaxHeaderBytes > 0 {
		limit = int64(srv.MaxHeaderBytes)
	}
	return max(n, limit)
}

// fieldsSize is what header (or trailer) fields h hold in memory: each
// field's name, value and headerFieldCost.
func fieldsSize(h http.Header) int64 {
	var n int64
	for name, values := range h {
		for _, v := range values {
			n += int64(len(name) + len(v) + headerFieldCost)
		}
	}
	return n
}

// errWaitingBytes is the cause of a queue_full reject for want of memory.
var errWaitingBytes = errors.New("request bodies waiting in this instance reached max_waiting_bytes")

// holdWaiting counts a waiting request's body of n bytes, unless the
// bodies already waiting and this one would exceed limit: then it
// counts nothing and reports false. A request that would wait alone is
// let in whatever its size: limit is at least max_body, and a body of
// max_body with its head (its headers) must still be able to wait.
func holdWaiting(n, limit int64) bool {
	for {
		held := waitingBytes.Load()
		if held > 0 && held+n > limit {
			return false
		}
		if waitingBytes.CompareAndSwap(held, held+n) {
			return true
		}
	}
}

// holdWaitingAnyway counts a waiting request's body of n bytes even
// beyond the limit: a request already admitted that waits again (a
// requeue). Give it back with releaseWaiting.
func holdWaitingAnyway(n int64) { waitingBytes.Add(n) }

// releaseWaiting gives back what holdWaiting counted, once the request
// is granted or leaves the queue.
func releaseWaiting(n int64) { waitingBytes.Add(-n) }

// waitingFull is the reject of a request whose body would take the
// waiting bodies of the process beyond max_waiting_bytes: queue_full,
// counted as the queue's reject. The bodies waiting now are gone, served
// or timed out, within max_wait.
func (h *Handler) waitingFull(name string) *fairqueue.RejectError {
	h.waitingOnce.Do(func() {
		h.logger.Warn("request bodies waiting in this instance reached max_waiting_bytes; rejecting with queue_full",
			zap.Int64("max_waiting_bytes", h.MaxWaitingBytes))
	})
	metrics.rejects.WithLabelValues(name, string(fairqueue.ReasonQueueFull)).Inc()
	return &fairqueue.RejectError{
		Reason: fairqueue.ReasonQueueFull, RetryAfter: time.Duration(h.MaxWait), Err: errWaitingBytes,
	}
}
