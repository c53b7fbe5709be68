package caddyfairqueue

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"sync/atomic"
	"time"

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
	api      api    // the stream's framing
	model    string // Ollama's chunks name it
	interval time.Duration
	events   bool
	start    time.Time // when the request joined the queue
	stop     chan struct{}
	done     chan struct{}
	// leave ends the request's wait: called when the client has not
	// taken a comment within frameTimeout.
	leave context.CancelFunc
	// gaveUp: a comment was not taken within frameTimeout (or failed),
	// and the response is lost. Set before done is closed.
	gaveUp atomic.Bool
	// committed: the header is sent. Written by run, read by halt after
	// done is closed.
	committed bool
	// queued is the ticket's live view, once queued: the latest one, as
	// a request may be queued again within one wait (moved from the
	// local queue into the shared one, reweighed, moved by a reload).
	queued  atomic.Pointer[fairqueue.Waiting]
	maxWait time.Duration // the wait's bound, from start
	shown   time.Duration // the last eta sent; 0: none yet
	shownAt time.Time
	spent   bool // the countdown from shown ran out: no eta any more

	// deadline is the server's write deadline of the response
	// (serverWriteDeadline), put back after each comment.
	deadline time.Time
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

// offer passes w on without blocking; it replaces the view the
// keepalive had: the ticket it names is the request's place now.
func (f *keepaliveFeed) offer(w fairqueue.Waiting) {
	if k := f.cur.Load(); k != nil {
		k.queued.Store(&w)
	}
}

// use feeds k (a wait's new keepalive) from now on.
func (f *keepaliveFeed) use(k *keepalive) {
	if f != nil {
		f.cur.Store(k)
	}
}

// startKeepalive starts feeding the client while the request waits,
// when it streams and sse_keepalive is set; otherwise it returns nil
// (whose halt is a no-op). A requeued request's second wait starts on
// the stream the first one committed. The wait is to run in ctx: the
// keepalive ends it when its client takes nothing, and halt at the
// latest.
func (c *call) startKeepalive() (k *keepalive, ctx context.Context) {
	h := c.h
	if !c.streaming || h.SSEKeepalive <= 0 {
		return nil, c.r.Context()
	}
	ctx, leave := context.WithCancel(c.r.Context())
	k = &keepalive{
		// A requeued request's: beneath the answer's writers, which time
		// and read the upstream's answer, not the queue's comments.
		w:        c.beneath(),
		api:      c.api,
		model:    c.model,
		interval: time.Duration(h.SSEKeepalive),
		events:   h.SSEQueueEvents,
		start:    c.start,
		stop:     make(chan struct{}),
		done:     make(chan struct{}),
		maxWait:  time.Duration(h.MaxWait),
		deadline: serverWriteDeadline(c.r),
		leave:    leave,

		committed: c.committed,
	}
	go k.run()
	return k, ctx
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
		if err := k.sendWithin(); err != nil {
			return // the client is gone or stuck: Acquire sees it through the context
		}
	}
}

// sendWithin is send, given up when the client has not taken the
// comment within frameTimeout (see stuckclient.go), or when it fails:
// the response is then lost, and the request leaves the queue at once,
// rather than keep its place (and a permit once granted) for a client
// that reads nothing. The bound is set and lifted here, in the
// keepalive's goroutine, the writer's only user meanwhile.
func (k *keepalive) sendWithin() error {
	lift := boundWrites(k.w, k.deadline)
	err := k.send()
	lift()
	if err != nil {
		k.gaveUp.Store(true)
		k.leave()
	}
	return err
}

// send commits the response on its first call, then writes the comment
// (and the queue event when asked for) and flushes.
func (k *keepalive) send() error {
	if !k.committed {
		k.api.streamHeader(k.w.Header())
		k.w.WriteHeader(http.StatusOK)
		k.committed = true
	}
	st := waitStatus{waited: time.Since(k.start)}
	if view := k.queued.Load(); view != nil {
		st.position = view.Position()
		st.eta = k.bound(view.ETA(), st.waited)
	}
	return writeFrame(k.w, k.api.waiting(st, k.events, k.model))
}

// bound makes the queue's estimate eta (0: unknown) one the client can
// trust: never beyond the wait that max_wait leaves (the request would
// time out first: no estimate then), and counting down from the last one
// sent, so that it never grows while the client waits. The rate behind
// it may drop; the client still sees an estimate that only shrinks, and
// none once the countdown has run out.
func (k *keepalive) bound(eta, waited time.Duration) time.Duration {
	now := time.Now()
	if k.spent || eta <= 0 || eta > k.maxWait-waited {
		return 0
	}
	if k.shown > 0 {
		left := k.shown - now.Sub(k.shownAt)
		if left < time.Second {
			// The countdown ran out and the request still waits: the
			// estimate was wrong, and a new one may not be larger. No
			// estimate for the rest of this wait.
			k.spent = true
			return 0
		}
		eta = min(eta, left)
	}
	k.shown, k.shownAt = eta, now
	return eta
}

// halt stops the keepalive and waits for its goroutine to end, so that
// the caller is the response's only writer again: within frameTimeout,
// as a comment being written is given up by then (its own write
// deadline: nothing sets one from another goroutine, as Caddy's writers
// are not safe for that). It reports whether
// the response's header was sent: then only SSE events may follow. A
// comment that the client has not taken within frameTimeout is given up
// (see stuckclient.go), whether the request still waited or was just
// granted: the response is lost (abandoned), and the request goes on to
// its end at once, as if its client had left: over HTTP/2 giving up
// resets the stream and so ends the request's context, over HTTP/1 and
// HTTP/3 nothing tells the request.
func (k *keepalive) halt() (committed, abandoned bool) {
	if k == nil {
		return false, false
	}
	close(k.stop)
	<-k.done
	k.leave() // the wait has ended
	return k.committed, k.gaveUp.Load()
}
