package caddyfairqueue

import (
	"net/http"
	"time"
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

// boundWrites gives the writes to w until frameTimeout from now, where w
// supports write deadlines, and returns what lifts the bound: the
// connection may serve on (an HTTP/1 connection keeps a deadline into
// its next request).
func boundWrites(w http.ResponseWriter) (lift func()) {
	rc := http.NewResponseController(w)
	if rc.SetWriteDeadline(time.Now().Add(frameTimeout)) != nil {
		return func() {}
	}
	return func() { _ = rc.SetWriteDeadline(time.Time{}) }
}
