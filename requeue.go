package caddyfairqueue

import (
	"errors"
	"maps"
	"net/http"
	"slices"
	"strconv"
	"time"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp/reverseproxy"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
)

// reasonUnreachable is the requeue reason of an upstream that could not
// be reached: reverse_proxy's dial failed or timed out (its DialError).
const reasonUnreachable = "unreachable"

// attempt is what one forwarding of a granted request to next produced.
type attempt struct {
	status int         // the upstream's final status; 0 if none was written
	header http.Header // the upstream's response header, never sent when held
	wrote  bool        // something of the answer reached the client
	held   bool        // the answer is a requeue_on status kept from the client
	err    error       // next's
	relay  *committedWriter
}

// refusal is an upstream's failure of a request: the upstream cools,
// and the request is requeued when it may be sent again.
type refusal struct {
	reason string        // the status code, reasonUnreachable or reasonFailed
	cool   time.Duration // how long the upstream is left out of dispatch
	// resend: the upstream cannot have run the request (a requeue_on
	// answer, or no connection), so it may be sent again.
	resend bool
}

// reasonFailed is the cooldown reason of an upstream that timed out or
// broke its answer after it had the request (reverse_proxy's 502 or 504
// past the dial): it cools, but the request is not sent again, as it may
// have run.
const reasonFailed = "failed"

// refused tells whether a's upstream refused or failed the request: a
// requeue_on status (held back, or passed on when no requeue is left),
// no connection (reverse_proxy's DialError: refused, or a dial timeout),
// or a 502 / 504 past the dial. nil: its answer stands.
func (h *Handler) refused(a attempt) *refusal {
	if slices.Contains(h.RequeueOn, a.status) {
		cool := retryAfter(a.header.Get("Retry-After"), time.Now())
		if cool <= 0 {
			cool = h.upstreamCooldown()
		}
		return &refusal{reason: strconv.Itoa(a.status), cool: min(cool, fairqueue.MaxCooldown), resend: true}
	}
	if a.err == nil || a.wrote {
		return nil
	}
	he, ok := errors.AsType[caddyhttp.HandlerError](a.err)
	if !ok || (he.StatusCode != http.StatusBadGateway && he.StatusCode != http.StatusGatewayTimeout) {
		return nil
	}
	if _, dial := errors.AsType[reverseproxy.DialError](a.err); dial {
		return &refusal{reason: reasonUnreachable, cool: h.upstreamCooldown(), resend: true}
	}
	return &refusal{reason: reasonFailed, cool: h.upstreamCooldown()}
}

// unseen reports whether nothing of a's answer reached the client, so
// that the request can be sent again.
func (a attempt) unseen() bool { return !a.wrote && (a.held || a.err != nil) }

// retryAfter reads a Retry-After value, seconds or an HTTP date; 0 when
// it is absent or unreadable.
func retryAfter(v string, now time.Time) time.Duration {
	if v == "" {
		return 0
	}
	if s, err := strconv.Atoi(v); err == nil {
		if s <= 0 {
			return 0
		}
		return time.Duration(min(s, int(fairqueue.MaxCooldown/time.Second))) * time.Second
	}
	if t, err := http.ParseTime(v); err == nil {
		return t.Sub(now)
	}
	return 0
}

// forward calls next for a request granted on an upstream of the pool.
// hold: a requeue_on answer may be held back (a requeue is left); else
// it is passed on like any other. committed: the keepalive sent the
// header of an event stream (see relay).
func (h *Handler) forward(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler, hold, committed bool) attempt {
	if committed {
		cw := &committedWriter{w: w, header: make(http.Header)}
		err := next.ServeHTTP(cw, r)
		return attempt{status: cw.status, header: cw.header, wrote: cw.wrote, err: err, relay: cw,
			held: hold && slices.Contains(h.RequeueOn, cw.status)}
	}
	hw := &holdWriter{w: w, header: w.Header().Clone()}
	if hold {
		hw.statuses = h.RequeueOn
	}
	err := next.ServeHTTP(hw, r)
	return attempt{status: hw.status, header: hw.header, wrote: hw.wrote, held: hw.held, err: err}
}

// requeue sends the request back into its queue at its place after its
// upstream refused it, and waits for a new grant; the keepalive, when
// configured, feeds a streaming client meanwhile. It returns the new
// permit, whether the response is committed by now, and the wait's error.
func (h *Handler) requeue(w http.ResponseWriter, r *http.Request, p *fairqueue.Permit, name string, rf *refusal, feed *keepaliveFeed, streaming, committed bool, start time.Time) (*fairqueue.Permit, bool, error) {
	up := p.Upstream()
	observeRequeue(name, up, rf.reason)
	observeCooldown(name, up)
	if c := h.logger.Check(zapcore.DebugLevel, "upstream refused the request; requeued"); c != nil {
		c.Write(zap.String("queue", name), zap.String("upstream", up), zap.String("reason", rf.reason), zap.Duration("cooldown", rf.cool))
	}
	if r.GetBody != nil { // the buffered body, sent again unchanged
		r.Body, _ = r.GetBody()
	}
	ka := h.startKeepalive(w, streaming, start, committed)
	feed.use(ka)
	np, err := p.Requeue(r.Context(), rf.cool)
	return np, ka.halt() || committed, err
}

// cool leaves p's upstream out of dispatch after it refused or failed
// the request and the request is not requeued: the answer stands.
func (h *Handler) cool(p *fairqueue.Permit, name string, rf *refusal) {
	p.Cool(rf.cool)
	observeCooldown(name, p.Upstream())
}

// holdWriter is next's ResponseWriter for a request granted on a pool
// upstream: it keeps the answer's header to itself until the status is
// known, so that an answer with one of statuses (requeue_on) never
// reaches the client, and another passes on unchanged.
type holdWriter struct {
	w        http.ResponseWriter
	header   http.Header // the answer's; copied to w's when it passes on
	statuses []int       // held; nil: none (no requeue left)
	status   int         // 0 until written
	held     bool
	wrote    bool // status or body reached the client
}

// Header is the answer's header until it passes on, then the writer's
// beneath (trailers set after the body go there).
func (hw *holdWriter) Header() http.Header {
	if hw.wrote {
		return hw.w.Header()
	}
	return hw.header
}

// WriteHeader holds a status of statuses or passes it on with the
// header. Informational answers (103 Early Hints) are dropped: the final
// one decides, and a held request must leave no trace.
func (hw *holdWriter) WriteHeader(code int) {
	if hw.status != 0 || (code < 200 && code != http.StatusSwitchingProtocols) {
		return
	}
	hw.status = code
	if slices.Contains(hw.statuses, code) {
		hw.held = true
		return
	}
	dst := hw.w.Header()
	clear(dst)
	maps.Copy(dst, hw.header)
	hw.w.WriteHeader(code)
	hw.wrote = true
}

func (hw *holdWriter) Write(b []byte) (int, error) {
	if hw.status == 0 {
		hw.WriteHeader(http.StatusOK)
	}
	if hw.held {
		return len(b), nil
	}
	return hw.w.Write(b)
}

// FlushError implements the flusher of http.ResponseController.
func (hw *holdWriter) FlushError() error {
	if !hw.wrote {
		return nil
	}
	return flush(hw.w)
}

// Flush implements http.Flusher.
func (hw *holdWriter) Flush() { _ = hw.FlushError() }

// Unwrap gives http.ResponseController the writer beneath (deadlines,
// hijacking of an upgraded connection).
func (hw *holdWriter) Unwrap() http.ResponseWriter { return hw.w }

// Interface guards
var (
	_ http.Flusher = (*holdWriter)(nil)
)
