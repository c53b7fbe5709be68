package caddyfairqueue

import (
	"cmp"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
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
// queue and calls next while holding it; or answers with a reject.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler) error {
	repl, ok := r.Context().Value(caddy.ReplacerCtxKey).(*caddy.Replacer)
	if !ok {
		repl = caddy.NewReplacer()
	}
	body, err := readBody(w, r, h.MaxBody, time.Duration(h.BodyTimeout))
	if err != nil {
		if _, ok := errors.AsType[*http.MaxBytesError](err); ok {
			writeTooLarge(w, h.MaxBody)
			return nil
		}
		if errors.Is(err, errBodyTimeout) {
			writeBodyTimeout(w, r, time.Duration(h.BodyTimeout))
			return nil
		}
		return caddyhttp.Error(http.StatusBadRequest, fmt.Errorf("reading request body: %w", err))
	}
	info := sniffBody(body)
	streaming := info.stream || wantsEventStream(r)
	repl.Set(phModel, info.model)
	repl.Set(phStreaming, streaming)
	req := h.fairRequest(repl, len(body), info)

	name := h.Name
	if h.dynamic {
		// The name may come from client input: make it valid UTF-8, as
		// logs and metric labels require.
		if name = strings.ToValidUTF8(repl.ReplaceAll(h.Name, ""), "\uFFFD"); name == "" {
			name = DefaultName
		}
	}
	repl.Set(phQueue, name)
	if !h.serves(name) {
		return h.notServed(w, r, repl)
	}

	var e *engine
	done := func() {}
	if len(name) > maxQueueNameLen {
		err = fmt.Errorf("queue name longer than %d bytes", maxQueueNameLen)
	} else {
		e, done, err = h.use(name, next)
	}
	if err != nil {
		if errors.Is(err, errTooManyQueues) {
			h.capOnce.Do(func() {
				h.logger.Warn("too many queues; rejecting requests for new ones", zap.Int("max", maxQueuesPerHandler))
			})
		}
		// The request names a queue this handler cannot open: as if
		// that queue were full. Its name, perhaps client input, stays
		// out of logs and metric labels.
		return h.reject(w, r, repl, overflowQueue, streaming, false, &fairqueue.RejectError{
			Reason: fairqueue.ReasonQueueFull, RetryAfter: time.Duration(h.MaxWait), Err: err,
		})
	}
	var permit *fairqueue.Permit
	var granted time.Time  // when Acquire returned the permit
	var usage *usageWriter // cost tokens: reads the response's usage
	forwarded := false     // next was called
	running := false       // counted in e.running
	defer func() {
		// What the request used, charged as its permit is released
		// (cost time: the hold ends here, before any abort grace).
		h.charge(permit, granted, forwarded, usage)
		if forwarded && r.Context().Err() != nil {
			// The client left while the upstream ran its request, however
			// reverse_proxy ended it: a plain request with a 499 and no
			// error, a stream with a panic, a relayed stream quietly.
			time.Sleep(h.abortGrace())
		}
		if running {
			e.running.Add(-1)
		}
		e.finish(permit, done)
	}()

	// The body waits with the request: bounded per process.
	if !holdWaiting(int64(len(body)), h.MaxWaitingBytes) {
		return h.reject(w, r, repl, name, streaming, false, h.waitingFull(name))
	}
	start := time.Now()
	ka := h.startKeepalive(w, streaming, start, false)
	feed := newKeepaliveFeed(ka)
	req.OnQueued = feed.onQueued()
	permit, err = h.acquire(r.Context(), &e, &done, req, start)
	releaseWaiting(int64(len(body)))
	granted = time.Now()
	committed := ka.halt()
	if err != nil {
		return h.notGranted(w, r, repl, name, streaming, committed, start, err)
	}
	running = true
	e.running.Add(1)
	if r.Context().Err() != nil {
		// Granted as the client left (the grant raced its cancel, or it
		// left just after): forwarded, the request would run upstream
		// for nobody, beside the requests of live clients. The deferred
		// finish hands the permit to the next waiter as this returns.
		h.record(r, repl, name, outcomeCancelled, "", permit.Waited(), permit.Position())
		return nil
	}
	own := next // the route of this handler's config
	next = e.forGrant(h, permit, own)
	outcome, reason := outcomeGranted, ""
	if permit.FailOpen() {
		outcome, reason = outcomeFailOpen, string(fairqueue.ReasonStoreUnavailable)
	}
	h.record(r, repl, name, outcome, reason, permit.Waited(), permit.Position())
	forwarded = true
	if h.Cost == CostTokens && !permit.FailOpen() {
		// Passes the response on as it comes; reads its usage.
		usage = newUsageWriter(w)
		usage.prompt = promptTokens(len(body))
		w = usage
	}
	if permit.Upstream() != "" {
		// A pool: the grant names the upstream, which may refuse the
		// request before anything reached the client; it then cools,
		// and the request waits again at its place, up to max_requeues.
		for left := h.maxRequeues(); ; left-- {
			grantUpstream(r, repl, permit.Upstream())
			a := h.forward(w, r, next, left > 0, committed)
			rf := h.refused(a)
			if rf == nil {
				return h.answered(w, a, name)
			}
			if left == 0 || !rf.resend || !a.unseen() || r.Context().Err() != nil {
				// No requeue left, the upstream may have run the request,
				// the client saw part of the answer, or it left: the
				// answer stands, and the upstream cools.
				h.cool(permit, name, rf)
				return h.answered(w, a, name)
			}
			np, nowCommitted, err := h.requeue(w, r, permit, name, rf, feed, streaming, committed, start)
			permit, granted, committed = np, time.Now(), nowCommitted
			if err != nil {
				return h.notGranted(w, r, repl, name, streaming, committed, start, err)
			}
			if permit.Upstream() == "" {
				// A reload took the pool away meanwhile.
				next = e.forGrant(h, permit, own)
				break
			}
		}
	}
	if committed {
		return h.relay(w, r, next, name)
	}
	if err := next.ServeHTTP(w, r); err != nil {
		return err // Caddy still writes the error: nothing may be flushed first
	}
	// Send what the upstream wrote now: the permit's release (a Redis
	// round trip) runs after this handler returns (see engine.finish).
	_ = http.NewResponseController(w).Flush()
	return nil
}

// answered ends a request whose answer a stands (see forward): relayed
// on a committed stream, or passed on.
func (h *Handler) answered(w http.ResponseWriter, a attempt, name string) error {
	if a.relay != nil {
		return h.relayEnd(w, a.relay, a.err, name)
	}
	if a.err != nil {
		return a.err // Caddy still writes the error: nothing may be flushed first
	}
	_ = http.NewResponseController(w).Flush()
	return nil
}

// notGranted answers a request whose wait for a permit (Acquire, or a
// requeue's) failed with err.
func (h *Handler) notGranted(w http.ResponseWriter, r *http.Request, repl *caddy.Replacer, name string, streaming, committed bool, start time.Time, err error) error {
	if rej, ok := errors.AsType[*fairqueue.RejectError](err); ok {
		return h.reject(w, r, repl, name, streaming, committed, rej)
	}
	if r.Context().Err() != nil {
		// The client left while waiting; there is nobody to answer.
		h.record(r, repl, name, outcomeCancelled, "", time.Since(start), 0)
		return nil
	}
	err = fmt.Errorf("fair_queue %s: %w", name, err)
	if committed {
		// Caddy's error answer would need the header that is sent.
		h.logger.Error("acquiring a permit", zap.String("queue", name), zap.Error(err))
		_ = writeEvent(w, "error", string(marshalError("The request queue failed.", "server_error", "internal_error")))
		return nil
	}
	return caddyhttp.Error(http.StatusInternalServerError, err)
}

// reject records and answers a request that got no permit; committed:
// sse_keepalive has sent the header of an event stream.
func (h *Handler) reject(w http.ResponseWriter, r *http.Request, repl *caddy.Replacer, name string, streaming, committed bool, rej *fairqueue.RejectError) error {
	h.record(r, repl, name, string(rej.Reason), string(rej.Reason), rej.Waited, rej.Position)
	p := h.policies[rej.Reason]
	if p == nil { // a reason newer than this handler
		p = h.policies[fairqueue.ReasonStoreUnavailable]
	}
	var err error
	if committed {
		err = p.writeCommitted(w, repl, rej)
	} else {
		err = p.write(w, repl, rej, streaming)
	}
	if err != nil {
		h.logger.Debug("writing reject", zap.String("queue", name), zap.Error(err))
	}
	if h.rejects != nil {
		h.rejects.add(repl, name, rej)
	}
	return nil
}

// record publishes a request's outcome: placeholders, access log fields,
// metrics and a debug log.
func (h *Handler) record(r *http.Request, repl *caddy.Replacer, name, outcome, reason string, waited time.Duration, position int) {
	waitMS := waited.Milliseconds()
	repl.Set(phOutcome, outcome)
	repl.Set(phReason, reason)
	repl.Set(phWaitMS, waitMS)
	repl.Set(phPosition, position)
	fields := []zap.Field{
		zap.String("queue", name),
		zap.String("outcome", outcome),
		zap.String("reason", reason),
		zap.Int64("wait_ms", waitMS),
		zap.Int("position", position),
	}
	if tenant, _ := repl.GetString(phTenant); tenant != "" { // a hash, set with Tenant only
		fields = append(fields, zap.String("tenant", tenant))
	}
	if extra, ok := r.Context().Value(caddyhttp.ExtraLogFieldsCtxKey).(*caddyhttp.ExtraLogFields); ok {
		extra.Set(zap.Dict("fair_queue", fields...))
	}
	observe(name, outcome, waited)
	if c := h.logger.Check(zapcore.DebugLevel, "fair queue"); c != nil {
		c.Write(fields...)
	}
}
