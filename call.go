package caddyfairqueue

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
)

// call is one request's life in the handler, in the order ServeHTTP
// runs it: read (the body, the queue's name), enter (the queue's
// engine), wait (for a permit), serve (next, holding the permit; on a
// pool, requeued while its upstream refuses it), and finish, which
// releases the permit. A request that gets no permit ends in reject or
// notGranted instead of serve.
type call struct {
	h    *Handler
	w    http.ResponseWriter // the client's; a usageWriter over it once forwarded with cost tokens
	r    *http.Request
	repl *caddy.Replacer
	own  caddyhttp.Handler // next in this handler's route
	next caddyhttp.Handler // the route that serves the grant (engine.forGrant)

	api       api    // the API the request speaks, from its path
	name      string // the queue's
	model     string // the body's "model"
	noModel   string // with names and a queue per model: why the request names none (noModel); "" if it does
	streaming bool   // the client asked for a streamed answer (its body, or its Accept header)
	// asksStream: the body asks the backend for a stream (api.asksStream),
	// how adaptive judges an answer whose Content-Type does not tell
	asksStream bool
	// headerFirst: a native /generate (headerFirst), whose answer is no
	// stream until its header says so
	headerFirst bool
	bodyLen     int
	weight      weight // in KV-cache tokens; its prompt estimated at enter
	req         fairqueue.Request

	e    *engine // the queue's engine; its successor's once a reload moved the queue
	done func()  // exits every engine entered

	start     time.Time // when the request joined the queue
	feed      *keepaliveFeed
	committed bool // the keepalive sent the header of an event stream
	abandoned bool // the keepalive gave up on a client that took nothing, or its connection closed as it waited: the response is lost

	permit    *fairqueue.Permit
	granted   time.Time     // when the permit came
	sent      *http.Request // a pool's request as first passed on: a requeue sends it again
	conns     *connTrace    // a pool's request: the connections it went out on
	usage     *usageWriter  // cost tokens: reads the answer's usage
	fb        *firstByteWriter
	forwarded bool               // next was called with the permit held now
	aborted   bool               // the client had left when next last returned (runNext)
	cut       context.CancelFunc // ends the forwarded request (cuttable)
	uncut     func() bool        // unhooks cut from the exit's (cuttable)
	running   bool               // counted in e.running
	tokens    int64              // the permit's tokens, counted in e.tokens while running
}

// read reads the request's body and names its queue. answered: the
// request is answered already (a body too large, too slow or broken),
// and err is what ServeHTTP returns.
func (c *call) read() (answered bool, err error) {
	h := c.h
	repl, ok := c.r.Context().Value(caddy.ReplacerCtxKey).(*caddy.Replacer)
	if !ok {
		repl = caddy.NewReplacer()
	}
	c.repl = repl
	c.api = apiOf(c.r)
	body, err := readBody(c.w, c.r, h.MaxBody, time.Duration(h.BodyTimeout))
	if err != nil {
		if _, ok := errors.AsType[*http.MaxBytesError](err); ok {
			writeTooLarge(c.w, c.api, h.MaxBody)
			return true, nil
		}
		if errors.Is(err, errBodyTimeout) {
			writeBodyTimeout(c.w, c.r, c.api, time.Duration(h.BodyTimeout))
			return true, nil
		}
		return true, caddyhttp.Error(http.StatusBadRequest, fmt.Errorf("reading request body: %w", err))
	}
	info := c.api.sniff(body)
	if generates(c.r, c.api) {
		info = asGenerate(info)
	}
	if info.Ambiguous {
		// Its queue would be one model's while a backend runs another.
		writeAmbiguousModel(c.w, c.api)
		return true, nil
	}
	if info.AmbiguousStream && goReadsStream(c.r, c.api) {
		// Whether its answer streams decides the keepalive, the shape
		// of a reject and what adaptive times, and would be a guess.
		writeAmbiguousStream(c.w, c.api)
		return true, nil
	}
	c.streaming = c.api.streams(info, c.r)
	c.asksStream = c.api.asksStream(info, c.r)
	c.headerFirst = headerFirst(c.r, c.api)
	c.model = info.Model
	repl.Set(phModel, c.api.modelName(info.Model)) // queueName may set another spelling
	repl.Set(phStreaming, c.streaming)
	c.bodyLen = len(body)
	c.weight = newWeight(info, c.api, len(body), h.defaultMaxTokens(), h.mediaTokens())
	none := generatesNone(c.r, c.api)
	if none {
		c.weight.budget = 0 // it generates none, whatever budget its body sets
	}
	c.weight.open = c.weight.open && !none && h.learnsBudget()
	c.nameQueue(info, body)
	repl.Set(phQueue, c.name)
	return false, nil
}

// enter enters the engine of the request's queue, and weighs the
// request with the queue's estimate; finish exits it.
func (c *call) enter() (err error) {
	// A fixed name is the operator's: the bounds are on client input.
	if c.h.dynamic && len(c.name) > maxQueueNameLen {
		return fmt.Errorf("queue name longer than %d bytes", maxQueueNameLen)
	}
	if c.h.dynamic && (c.name == overflowQueue || c.name == unknownQueue) {
		// The labels of requests refused without a queue: a queue of
		// that name would count as them, and its end delete their series.
		return fmt.Errorf("queue name %s is reserved", c.name)
	}
	if c.e, c.done, err = c.h.use(c.name, c.own); err != nil {
		return err
	}
	c.weigh()
	return nil
}

// weigh estimates the request's prompt tokens with its queue's bytes per
// token; with cost tokens, charges the weight; and gives the engine the
// weight (the engine clamps it to the capacity; counted when it is).
func (c *call) weigh() {
	c.weight.estimate(c.e.kv.bytesPerToken())
	if c.weight.open {
		c.weight.budget = c.e.budget.get(c.weight.budget)
	}
	if c.h.Cost == CostTokens && c.h.fair() {
		c.req.Cost = tokensEstimate(c.weight, c.h.MaxCost)
	}
	// Unclamped, and also where the queue counts no tokens: a reload
	// that turns kv_tokens on while the request waits weighs it at its
	// grant (fairqueue.Request.Tokens).
	c.req.Tokens = c.weight.tokens()
	if _, clamped := c.e.q.Config().ClampTokens(c.req.Tokens); clamped {
		observeClamped(c.name)
	}
}

// overflow answers a request whose queue the handler cannot open (err,
// from enter): as if that queue were full. Its name, perhaps client
// input, stays out of logs and metric labels.
func (c *call) overflow(err error) error {
	if errors.Is(err, errTooManyQueues) {
		c.h.capOnce.Do(func() {
			c.h.logger.Warn("too many queues; rejecting requests for new ones", zap.Int("max", maxQueuesPerHandler))
		})
	}
	c.name = overflowQueue
	// No engine, so no observer, counts this reject.
	metrics.rejects.WithLabelValues(overflowQueue, string(fairqueue.ReasonQueueFull)).Inc()
	return c.reject(&fairqueue.RejectError{
		Reason: fairqueue.ReasonQueueFull, RetryAfter: time.Duration(c.h.MaxWait), Err: err,
	})
}

// wait waits for a permit, feeding a streaming client meanwhile when
// sse_keepalive is set. The body waits with the request, bounded per
// process (max_waiting_bytes).
func (c *call) wait() error {
	n := waitingSize(c.r, c.bodyLen)
	if !holdWaiting(n, c.h.MaxWaitingBytes) {
		return c.h.waitingFull(c.name)
	}
	c.start = time.Now()
	ka, ctx := c.startKeepalive()
	ctx, hangup := watchHangup(ctx, c.r)
	c.feed = newKeepaliveFeed(ka)
	c.req.OnQueued = c.feed.onQueued()
	p, err := c.acquire(ctx)
	releaseWaiting(n)
	c.permit, c.granted = p, time.Now()
	c.committed, c.abandoned = ka.halt()
	c.abandoned = hangup.stop() || c.abandoned
	return err
}

// route sets the next handler that serves the grant (forGrant) and, for
// a plain grant on the handler's own pool route, the upstream it runs on.
func (c *call) route() {
	var dial string
	c.next, dial = c.e.forGrant(c.h, c.permit, c.own)
	if dial != "" {
		grantUpstream(c.r, c.repl, dial)
	}
}

// serve forwards the granted request to the route that fits its grant
// and answers with what it answers. A grant on a pool's upstream goes
// through servePool first.
func (c *call) serve() error {
	c.route()
	outcome, reason := outcomeGranted, ""
	if c.permit.FailOpen() {
		outcome, reason = outcomeFailOpen, string(fairqueue.ReasonStoreUnavailable)
	}
	c.record(outcome, reason, c.permit.Waited(), c.permit.Position())
	c.forwarded = true
	c.cuttable()
	watch := watchRunning(c.r, c.cut)
	defer watch.stop() // also while a requeued request waits again
	c.fb = newFirstByteWriter(c.w)
	c.fb.watch = watch // until an upgrade takes the connection
	c.w = c.fb
	c.fb.forwardTo(c.permit.Upstream())
	if c.readsUsage() {
		// Passes the answer on as it comes; reads its usage.
		c.usage = newUsageWriter(c.w)
		c.w = c.usage
	}
	if c.permit.Upstream() != "" {
		if served, err := c.servePool(); served {
			return err
		}
		c.fb.forwardTo("") // timed from its forwarding below, not the refused one's
	}
	if c.committed {
		return c.relay()
	}
	if err := c.runNext(c.w); err != nil {
		return err // Caddy still writes the error: nothing may be flushed first
	}
	// Send what the upstream wrote now: the permit's release (a Redis
	// round trip) runs after this handler returns (see engine.finish).
	_ = http.NewResponseController(c.w).Flush()
	return nil
}

// servePool serves a request granted on an upstream of the pool, which
// may refuse it before anything reached the client: the upstream then
// cools, and the request waits again at its place, up to max_requeues.
// served is false when a reload took the pool away while the request
// waited again: serve goes on with the route of its new grant.
func (c *call) servePool() (served bool, err error) {
	c.conns = traceConns(c.r)
	c.sent = c.r.Clone(c.r.Context())
	for requeues := c.h.maxRequeues(); ; requeues-- {
		grantUpstream(c.r, c.repl, c.permit.Upstream())
		c.fb.forwardTo(c.permit.Upstream())
		c.conns.forwarding()
		a := c.forward(requeues > 0)
		a.stale = c.conns.stale(a.err)
		rf := c.h.refused(a)
		if rf == nil {
			return true, c.answered(a)
		}
		if a.late {
			return true, c.refusedLate(rf)
		}
		if !c.mayRequeue(requeues, rf, a) {
			c.cool(rf)
			return true, c.answered(a) // an adaptive queue learns of it at finish
		}
		if err := c.requeue(rf); err != nil {
			return true, c.notGranted(err)
		}
		if c.left() {
			// Granted again for nobody: finish hands the permit on,
			// charging nothing for the grant, which ran nowhere.
			c.forwarded = false
			return true, nil
		}
		c.cuttable() // a reload may have moved it to a Redis queue
		if c.permit.Upstream() == "" {
			c.route()
			return false, nil
		}
	}
}

// cuttable lets the exit end the forwarded request (engine.endRunning)
// when its queue is in a shared store: at its first forwarding, or at a
// later one once a reload moved its queue there while it waited again.
// A request granted on a pool's upstream may wait again, so it takes a
// context that can be ended at its first forwarding in any store: r is
// written only then (cancelable). So does an HTTP/1 request whose
// connection serve watches for its client's close (watchRunning).
func (c *call) cuttable() {
	if c.cut == nil && (c.e.remote || c.permit.Upstream() != "" || hangupWatchable(c.r)) {
		c.cut = cancelable(c.r)
	}
	if c.e.remote && c.uncut == nil { // c.cut is set: the queue is remote
		c.uncut = hookCut(c.cut)
	}
}

// finish ends the request: it charges what the request used, holds an
// aborted request's permit for the abort grace, and releases the permit
// and the engines entered.
func (c *call) finish() {
	// Cost time: the hold ends here, before any abort grace.
	c.h.charge(c.permit, c.granted, c.forwarded, c.usage)
	c.learn()
	if c.fb != nil && c.fb.first > 0 {
		observeFirstByte(c.name, c.fb.upstream, c.fb.first)
	}
	c.observeAnswer()
	if c.aborted {
		// The client left while the upstream ran its request, however
		// reverse_proxy ended it: a plain request with a 499 and no
		// error, a stream with a panic, a relayed stream quietly. One
		// that left after next returned aborted nothing: the upstream
		// had ended (its answer's end was still on its way).
		time.Sleep(c.h.abortGrace())
	}
	if c.running {
		c.e.running.Add(-1)
		c.e.tokens.Add(-c.tokens)
	}
	c.e.finish(c.permit, c.done)
	if c.uncut != nil {
		c.uncut()
	}
}

// runNext calls next with w, and notes whether the client had left
// when next ended, by returning or by a panic (reverse_proxy aborts an
// answer whose body broke off with one): the upstream may then still
// run the aborted request, and finish holds its permit for the abort
// grace.
// Each forwarding notes it anew: a refused one did not run (requeue).
func (c *call) runNext(w http.ResponseWriter) error {
	defer func() { c.aborted = c.left() }()
	err := c.next.ServeHTTP(w, c.r)
	if c.fb != nil {
		c.fb.unreached = unreached(err) // observeAnswer
	}
	return err
}

// left reports whether the client has gone: its request's context
// ended, or its response was given up (abandoned: the keepalive gave
// up on it, or its connection was seen closed as it waited).
func (c *call) left() bool { return c.abandoned || c.r.Context().Err() != nil }

// readsUsage reports whether the answer's usage is read (cost tokens,
// and the prompt estimate of a queue that counts KV-cache tokens): not
// for a fail-open grant, which no store charges or counts.
func (c *call) readsUsage() bool {
	return (c.h.Cost == CostTokens || c.h.countsTokens()) && !c.permit.FailOpen()
}

// learn teaches the queue's prompt estimator the prompt tokens the
// answer's usage counted for the request's prompt text, when both are
// known and the prompt is text alone (no token ids, no images or audio),
// and its budget estimator the
// tokens the answer generated, when the request set no budget.
func (c *call) learn() {
	if c.usage == nil {
		return
	}
	if c.weight.open {
		if tokens, ok := c.usage.completionTokens(); ok {
			c.e.budget.observe(tokens / float64(c.weight.completions)) // one completion's
		}
	}
	if c.weight.noPrompt || c.weight.ids > 0 || c.weight.media > 0 || c.weight.reasoning {
		// The usage counts more than the prompt's text (the body, token
		// ids, media), or perhaps less (reasoning a template leaves out).
		return
	}
	if tokens, ok := c.usage.promptTokens(); ok {
		c.e.kv.observe(c.weight.text, tokens)
	}
}

// mayRequeue reports whether a request whose upstream refused it (rf,
// in attempt a) waits again: a requeue is left, the upstream cannot have
// run it, nothing of its answer reached the client, and the client is
// still there. Otherwise the answer stands, and the upstream cools.
func (c *call) mayRequeue(requeues int, rf *refusal, a attempt) bool {
	return requeues > 0 && rf.resend && a.unseen() && !c.left()
}

// answered ends a request whose answer a stands (see forward): relayed
// on a committed stream, or passed on.
func (c *call) answered(a attempt) error {
	if a.relay != nil {
		return c.relayEnd(a.relay, a.err)
	}
	if a.err != nil {
		return a.err // Caddy still writes the error: nothing may be flushed first
	}
	_ = http.NewResponseController(c.w).Flush()
	return nil
}

// statusClientClosedRequest is the status of a request whose client
// left, as reverse_proxy records it (nginx's 499).
const statusClientClosedRequest = 499

// leftUnserved records a request whose client left before it was
// forwarded: outcome cancelled, and status 499 in the access log, as
// reverse_proxy records a client that leaves while it runs (else the
// log shows a status 0, an answer never sent); where the keepalive sent
// a header already, that one.
func (c *call) leftUnserved(waited time.Duration, position int) {
	c.record(outcomeCancelled, "", waited, position)
	if !c.committed {
		c.w.WriteHeader(statusClientClosedRequest)
	}
}

// notGranted answers a request whose wait for a permit (Acquire, or a
// requeue's) failed with err.
func (c *call) notGranted(err error) error {
	if rej, ok := errors.AsType[*fairqueue.RejectError](err); ok {
		return c.reject(rej)
	}
	if c.left() {
		// The client left while waiting; there is nobody to answer.
		c.leftUnserved(time.Since(c.start), 0)
		return nil
	}
	err = fmt.Errorf("fair_queue %s: %w", c.name, err)
	if c.committed {
		// Caddy's error answer would need the header that is sent.
		c.h.logger.Error("acquiring a permit", zap.String("queue", c.name), zap.Error(err))
		w := c.beneath() // no answer of the upstream's
		lift := boundLastWrites(w, c.r)
		_ = writeFrame(w, c.api.errorFrame(c.api.errorBody("The request queue failed.", "server_error", "internal_error")))
		lift()
		return nil
	}
	return caddyhttp.Error(http.StatusInternalServerError, err)
}

// reject records and answers a request that got no permit: an event on
// a committed stream, else its reject policy's answer.
func (c *call) reject(rej *fairqueue.RejectError) error {
	h := c.h
	c.record(string(rej.Reason), string(rej.Reason), rej.Waited, rej.Position)
	p := h.policies[rej.Reason]
	if p == nil { // a reason newer than this handler
		p = h.policies[fairqueue.ReasonStoreUnavailable]
	}
	var err error
	w := c.beneath()                // a requeued request's: no answer of its upstream's
	lift := boundLastWrites(w, c.r) // an event is flushed: a client that reads nothing would hold it
	if c.committed {
		err = p.writeCommitted(w, c.repl, rej, c.api)
	} else {
		err = p.write(w, c.repl, rej, c.streaming, c.api)
	}
	lift()
	if err != nil {
		h.logger.Debug("writing reject", zap.String("queue", c.name), zap.Error(err))
	}
	if h.rejects != nil {
		h.rejects.add(c.repl, c.name, rej)
	}
	return nil
}
