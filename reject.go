package caddyfairqueue

import (
	"bytes"
	"cmp"
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
)

// RejectConfig shapes the answer to requests that get no permit. An
// entry without Reasons sets defaults for every reason; an entry with
// Reasons overrides, field by field, the defaults for those reasons.
//
// Placeholders in Body and SSEData are replaced when the answer is
// written. A placeholder lies inside one JSON string, where its value is
// JSON-escaped, or wholly outside strings, where its value is written
// only when it is a JSON number, true, false or null, and is null
// otherwise (so a client's value adds no structure: a valid JSON
// template stays valid JSON). Unknown placeholders, and every other
// brace and backslash, are left as they are. Besides the request's
// placeholders, these describe the reject:
//
//	{http.fair_queue.reason}       timeout, queue_full, shutting_down or store_unavailable
//	{http.fair_queue.message}      the default human-readable message
//	{http.fair_queue.retry_after}  the Retry-After value, in seconds
//	{http.fair_queue.wait_ms}      how long the request waited, in milliseconds
//	{http.fair_queue.position}     its last known place in the queue (1 = next), 0 if never queued
//	{http.fair_queue.queue}        the queue name
//	{http.fair_queue.model}        the "model" of the JSON request body
type RejectConfig struct {
	// Reasons this entry applies to: timeout (the request waited
	// max_wait), queue_full (a queue length cap, max_waiting_bytes, or a
	// queue name the handler cannot open refused it), shutting_down (the server is exiting) or
	// store_unavailable (Redis is unreachable and on_store_error is
	// fail_closed). Empty: every reason.
	Reasons []string `json:"reasons,omitempty"`

	// Status is the HTTP status of a non-streaming answer, 200-599.
	// Default 429 for timeout and queue_full, 503 for shutting_down and
	// store_unavailable.
	Status int `json:"status,omitempty"`

	// RetryAfter is the Retry-After header: a duration (sent in whole
	// seconds, rounded up, at least 1) or "auto", the engine's estimate
	// from the queue's observed drain rate. Default "auto".
	RetryAfter string `json:"retry_after,omitempty"`

	// Body is the template of a non-streaming answer, sent with
	// Content-Type application/json. Default: an OpenAI-style error,
	// {"error":{"message":"...","type":"rate_limit_exceeded","code":"timeout"}}
	// (type server_error for shutting_down and store_unavailable).
	Body string `json:"body,omitempty"`

	// SSEStatus is the HTTP status of an answer to a streaming request
	// (Accept: text/event-stream, or "stream": true in the JSON body),
	// 200-599. Default 200, so that SSE clients read the event. A status
	// of 300 or more gets the JSON body (Body, Content-Type
	// application/json) instead of the event: SDKs read an error status's
	// body as a JSON error object, never as a stream. When sse_keepalive
	// has already sent the header (200), only the event is sent: put
	// {http.fair_queue.reason} in SSEData to tell why.
	SSEStatus int `json:"sse_status,omitempty"`

	// SSEEvent is the event name of the SSE answer. Default "error".
	SSEEvent string `json:"sse_event,omitempty"`

	// SSEData is the template of the SSE event's data; a multi-line
	// result is sent as several data lines. Default: Body when set, else
	// the default error object.
	SSEData string `json:"sse_data,omitempty"`
}

// reasons are the reasons the engine rejects with, in the order they are
// documented; their metric series exist from a queue's first use.
var reasons = []fairqueue.Reason{
	fairqueue.ReasonTimeout,
	fairqueue.ReasonQueueFull,
	fairqueue.ReasonShuttingDown,
	fairqueue.ReasonStoreUnavailable,
}

// checkReason is the rule of RejectConfig.Reasons, for one reason.
func checkReason(r string) error {
	if !slices.Contains(reasons, fairqueue.Reason(r)) {
		msg := fmt.Sprintf("unknown reason %q (want timeout, queue_full, shutting_down or store_unavailable)", r)
		return optErr("reject: "+msg, "", msg)
	}
	return nil
}

// checkStatus is the rule of Status and SSEStatus (option name): a final
// answer, not an informational 1xx.
func checkStatus(name string, code int) error {
	if code < 200 || code > 599 {
		msg := fmt.Sprintf("must be 200-599, got %d", code)
		return optErr("reject: "+name+" "+msg, name, msg)
	}
	return nil
}

// rejectPolicy is the resolved answer for one reason.
type rejectPolicy struct {
	status     int
	retryAfter time.Duration // 0: auto
	body       string        // "": the default error object
	sseStatus  int
	sseEvent   string
	sseData    string // "": the default error object
}

// check validates one entry; it names the offending option.
func (rc *RejectConfig) check() error {
	for i, r := range rc.Reasons {
		if err := checkReason(r); err != nil {
			return inField("reasons["+strconv.Itoa(i)+"]", err)
		}
	}
	for _, st := range []struct {
		name string
		code int
	}{{"status", rc.Status}, {"sse_status", rc.SSEStatus}} {
		if st.code != 0 {
			if err := checkStatus(st.name, st.code); err != nil {
				return err
			}
		}
	}
	if _, err := parseRetryAfter(rc.RetryAfter); err != nil {
		return err
	}
	if strings.ContainsAny(rc.SSEEvent, "\r\n") {
		msg := fmt.Sprintf("must be one line, got %q", rc.SSEEvent)
		return optErr("reject: sse_event "+msg, "sse_event", msg)
	}
	return nil
}

func parseRetryAfter(s string) (time.Duration, error) {
	if s == "" || s == "auto" {
		return 0, nil
	}
	d, err := caddy.ParseDuration(s)
	if err != nil || d <= 0 {
		msg := fmt.Sprintf("must be a positive duration or auto, got %q", s)
		return 0, optErr("reject: retry_after "+msg, "retry_after", msg)
	}
	return d, nil
}

// compileRejects resolves the entries into one policy per reason:
// built-in defaults, then entries without reasons, then entries naming
// the reason, each overriding only the fields it sets. A field set twice
// at one level for one reason is refused.
func compileRejects(entries []*RejectConfig) (map[fairqueue.Reason]*rejectPolicy, error) {
	for i, rc := range entries {
		if rc == nil {
			return nil, fmt.Errorf("reject[%d]: an entry is null", i)
		}
		if err := rc.check(); err != nil {
			return nil, inField(rejectEntry(i), err)
		}
	}
	out := make(map[fairqueue.Reason]*rejectPolicy, len(reasons))
	for _, r := range reasons {
		var all, own RejectConfig
		for j, rc := range entries {
			dst := &all
			if len(rc.Reasons) > 0 {
				if !slices.Contains(rc.Reasons, string(r)) {
					continue
				}
				dst = &own
			}
			if dup := merge(dst, rc); dup != "" {
				scope := "for every reason"
				if dst == &own {
					scope = "for reason " + string(r)
				}
				// The entry before j that set it for r at the same level.
				first := slices.IndexFunc(entries[:j], func(e *RejectConfig) bool {
					sameLevel := len(e.Reasons) == 0
					if dst == &own {
						sameLevel = slices.Contains(e.Reasons, string(r))
					}
					return sameLevel && sets(e, dup)
				})
				return nil, optErr(fmt.Sprintf("reject: %s is set twice %s", dup, scope), rejectEntry(j)+"."+dup,
					fmt.Sprintf("is set twice %s (%s sets it too)", scope, rejectEntry(first)))
			}
		}
		status := http.StatusTooManyRequests
		if r == fairqueue.ReasonShuttingDown || r == fairqueue.ReasonStoreUnavailable {
			status = http.StatusServiceUnavailable
		}
		p := &rejectPolicy{
			status:    cmp.Or(own.Status, all.Status, status),
			body:      cmp.Or(own.Body, all.Body),
			sseStatus: cmp.Or(own.SSEStatus, all.SSEStatus, http.StatusOK),
			sseEvent:  cmp.Or(own.SSEEvent, all.SSEEvent, "error"),
		}
		p.retryAfter, _ = parseRetryAfter(cmp.Or(own.RetryAfter, all.RetryAfter))
		p.sseData = cmp.Or(own.SSEData, all.SSEData, p.body)
		out[r] = p
	}
	return out, nil
}

// rejectEntry is the JSON path of entry i of Reject.
func rejectEntry(i int) string { return "reject[" + strconv.Itoa(i) + "]" }

// sets reports whether rc sets the field that merge calls name.
func sets(rc *RejectConfig, name string) bool {
	switch name {
	case "status":
		return rc.Status != 0
	case "retry_after":
		return rc.RetryAfter != ""
	case "body":
		return rc.Body != ""
	case "sse_status":
		return rc.SSEStatus != 0
	case "sse_event":
		return rc.SSEEvent != ""
	case "sse_data":
		return rc.SSEData != ""
	}
	return false
}

// merge copies the fields src sets into dst; it returns the name of a
// field both set, if any.
func merge(dst, src *RejectConfig) (dup string) {
	mergeField(&dup, "status", &dst.Status, src.Status)
	mergeField(&dup, "retry_after", &dst.RetryAfter, src.RetryAfter)
	mergeField(&dup, "body", &dst.Body, src.Body)
	mergeField(&dup, "sse_status", &dst.SSEStatus, src.SSEStatus)
	mergeField(&dup, "sse_event", &dst.SSEEvent, src.SSEEvent)
	mergeField(&dup, "sse_data", &dst.SSEData, src.SSEData)
	return dup
}

// mergeField sets *d to v when v is set; a *d already set names the
// field in *dup, unless a field is named there already.
func mergeField[T comparable](dup *string, name string, d *T, v T) {
	var zero T
	if v == zero {
		return
	}
	if *d != zero && *dup == "" {
		*dup = name
	}
	*d = v
}

// rejectMessage is the default human-readable message of a reject.
func rejectMessage(rej *fairqueue.RejectError, retryAfter int) string {
	retry := fmt.Sprintf("Please retry after %d seconds.", retryAfter)
	if retryAfter == 1 {
		retry = "Please retry after 1 second."
	}
	switch rej.Reason {
	case fairqueue.ReasonTimeout:
		return fmt.Sprintf("The server is busy: the request waited %s in the queue without being served. %s",
			rej.Waited.Round(100*time.Millisecond), retry)
	case fairqueue.ReasonQueueFull:
		return "The server is busy: the request queue is full. " + retry
	case fairqueue.ReasonShuttingDown:
		return "The server is shutting down. " + retry
	default:
		return "The request queue is temporarily unavailable. " + retry
	}
}

// errorType is the OpenAI error type of a reason.
func errorType(r fairqueue.Reason) string {
	if r == fairqueue.ReasonTimeout || r == fairqueue.ReasonQueueFull {
		return "rate_limit_exceeded"
	}
	return "server_error"
}

// retryAfterSeconds is the Retry-After value: whole seconds, rounded up,
// at least 1.
func retryAfterSeconds(configured, estimate time.Duration) int {
	d := configured
	if d <= 0 {
		d = estimate
	}
	return max(1, int(math.Ceil(d.Seconds())))
}

// write answers a request that got no permit. It sets the placeholders
// of the reject (reason, retry_after, message); the caller has set the
// others (queue, model, wait_ms, position).
func (p *rejectPolicy) write(w http.ResponseWriter, repl *caddy.Replacer, rej *fairqueue.RejectError, streaming bool, a api) error {
	retry, msg := p.setPlaceholders(repl, rej)
	h := w.Header()
	h.Set("Fair-Queue-Reason", string(rej.Reason))
	h.Set("Retry-After", strconv.Itoa(retry))
	h.Set("Cache-Control", "no-cache")
	status := p.status
	if streaming && !a.ollama() { // Ollama's clients read an error as JSON whatever they asked for
		status = p.sseStatus
	}
	// An SSE error event is read as such only in a 2xx stream: an SDK
	// that sees an error status reads the body as a JSON error object
	// (the openai and AI SDK libraries do), so a streaming request
	// rejected with one gets the JSON body too, with that status.
	if !streaming || status >= 300 || a.ollama() {
		var body []byte
		if p.body != "" {
			body = []byte(replaceJSON(repl, p.body))
		} else {
			body = a.errorBody(msg, errorType(rej.Reason), string(rej.Reason))
		}
		return writeJSON(w, status, body)
	}
	h.Set("Content-Type", "text/event-stream")
	h.Del("Content-Length")
	w.WriteHeader(status)
	return p.writeEvent(w, repl, rej, msg)
}

// writeCommitted answers, with the SSE reject event alone, a streaming
// request whose response header sse_keepalive has already sent: the
// status, Fair-Queue-Reason and Retry-After can no longer be, so the
// event's data must say why (the default error object has the reason as
// its code). An Ollama stream gets one error line: the configured body,
// or Ollama's error object.
func (p *rejectPolicy) writeCommitted(w http.ResponseWriter, repl *caddy.Replacer, rej *fairqueue.RejectError, a api) error {
	_, msg := p.setPlaceholders(repl, rej)
	if a.ollama() {
		body := a.errorBody(msg, "", "")
		if p.body != "" {
			body = oneLine(replaceJSON(repl, p.body))
		}
		return writeFrame(w, a.errorFrame(body))
	}
	return p.writeEvent(w, repl, rej, msg)
}

// oneLine puts a reject body on one line, an NDJSON stream's frame: JSON
// compacted, anything else with its line breaks made spaces.
func oneLine(body string) []byte {
	var b bytes.Buffer
	if json.Compact(&b, []byte(body)) == nil {
		return b.Bytes()
	}
	return []byte(strings.NewReplacer("\r\n", " ", "\r", " ", "\n", " ").Replace(body))
}

// setPlaceholders sets the reject's placeholders and returns the
// Retry-After value and the default message.
func (p *rejectPolicy) setPlaceholders(repl *caddy.Replacer, rej *fairqueue.RejectError) (retry int, msg string) {
	retry = retryAfterSeconds(p.retryAfter, rej.RetryAfter)
	msg = rejectMessage(rej, retry)
	repl.Set(phReason, string(rej.Reason))
	repl.Set(phRetryAfter, retry)
	repl.Set(phMessage, msg)
	return retry, msg
}

// writeEvent writes and flushes the SSE reject event.
func (p *rejectPolicy) writeEvent(w http.ResponseWriter, repl *caddy.Replacer, rej *fairqueue.RejectError, msg string) error {
	var data string
	if p.sseData != "" {
		data = replaceJSON(repl, p.sseData)
	} else {
		data = string(marshalError(msg, errorType(rej.Reason), string(rej.Reason)))
	}
	return writeEvent(w, p.sseEvent, data)
}
