package caddyfairqueue

import (
	"bytes"
	"encoding/json"
	"errors"
	"net/http"
	"strconv"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// A granted request whose response the keepalive committed (the 200
// event-stream header is sent) is relayed: the upstream's body passes on
// as events, and its error becomes an SSE error event.

// relay serves a granted request whose response the keepalive already
// committed: the upstream's status and header are gone, its body is
// relayed as it comes, and an error (a status other than 2xx, or the
// next handler failing before it wrote anything) becomes an SSE error
// event.
func (c *call) relay() error {
	cw := &committedWriter{w: c.w, header: make(http.Header)}
	return c.relayEnd(cw, c.nextUnencoded(cw))
}

// nextUnencoded calls next with w on a committed stream, the request
// without the codings the client accepts: the header went out without
// the upstream's Content-Encoding, so the upstream's body must come
// unencoded (reverse_proxy's transport then asks for gzip itself and
// decodes it), or the client would read compressed bytes as text. The
// request goes on in place, as Caddy's placeholders read it there (a
// header a handler after this one sets, read by reverse_proxy's
// header_up), and gets its Accept-Encoding back once next returns.
func (c *call) nextUnencoded(w http.ResponseWriter) error {
	if v, ok := c.r.Header["Accept-Encoding"]; ok {
		delete(c.r.Header, "Accept-Encoding")
		defer func() { c.r.Header["Accept-Encoding"] = v }()
	}
	return c.runNext(w)
}

// relayEnd ends a relayed answer that cw holds, next's error err. A
// status that is not a success (an error, or a redirect the client can
// no longer follow) ends the stream with an error event.
func (c *call) relayEnd(cw *committedWriter, err error) error {
	status := cw.status
	defer func() {
		if c.fb != nil && c.fb.status == 0 {
			// The header went out with the keepalive: the upstream's
			// status is noted here, so that an adaptive queue counts a
			// 429/503 as a refusal, not its error event as a first byte.
			c.fb.status = status
			// The upstream's own error, not next's failure (reverse_proxy
			// gave up waiting, or its client left): no first token was
			// waited for.
			c.fb.errorAnswered = upstreamFailed(cw.status)
			if cw.status != 0 && cw.status != statusClientClosedRequest {
				c.fb.kind = answerKindOf(cw.header) // a plain answer relayed is no stream
			}
		}
	}()
	if err != nil {
		status = http.StatusBadGateway
		if he, ok := errors.AsType[caddyhttp.HandlerError](err); ok && he.StatusCode != 0 {
			status = he.StatusCode
		}
		level := zapcore.DebugLevel
		if status >= 500 {
			level = zapcore.ErrorLevel
		}
		if l := c.h.logger.Check(level, "upstream failed after the stream was committed"); l != nil {
			l.Write(zap.String("queue", c.name), zap.Int("status", status), zap.Error(err))
		}
		if cw.wrote {
			return nil // an event may be half written: end the stream
		}
	}
	if !failed(status) {
		return flush(c.w)
	}
	// The event is the queue's, not the upstream's answer: it goes
	// beneath the writers that time and read that answer, and, as the
	// queue's other frames, within frameTimeout: a client that takes
	// nothing would hold the permit with it (stuckclient.go).
	w := c.beneath()
	lift := boundLastWrites(w, c.r)
	_ = writeFrame(w, c.api.errorFrame(c.api.upstreamErrorBody(status, cw.errBody.Bytes()))) // fails only when the client is gone or stuck
	lift()
	return nil
}

// beneath is the client's writer beneath the answer's writers
// (firstByteWriter and the usageWriter over it), for what the queue
// itself writes once the request is forwarded: the upstream's time to
// first byte and usage count none of it.
func (c *call) beneath() http.ResponseWriter {
	if c.fb != nil {
		return c.fb.ResponseWriter
	}
	return c.w
}

// failed reports whether an upstream's final status is not a success:
// on a committed stream, its answer becomes an error event (a redirect
// cannot be followed once the 200 is out).
func failed(status int) bool { return status >= http.StatusMultipleChoices }

// upstreamError is the data of the SSE error event for an upstream's
// error answer: its body when that is a JSON object with an "error"
// member (on one line); another JSON object (SGLang's and older vLLM's
// {"object":"error","message":...}) as that member, since OpenAI's
// Python client raises an error event only when its data has one, and
// yields any other as a chunk; else the default error object.
func upstreamError(status int, body []byte) []byte {
	body = bytes.TrimSpace(body)
	var obj map[string]json.RawMessage
	if len(body) > 0 && len(body) <= maxUpstreamErrorBody && json.Unmarshal(body, &obj) == nil && obj != nil {
		var b bytes.Buffer
		if json.Compact(&b, body) == nil {
			if truthy(obj["error"]) {
				return b.Bytes()
			}
			return append(append([]byte(`{"error":`), b.Bytes()...), '}')
		}
	}
	typ := "invalid_request_error"
	switch {
	case status == http.StatusTooManyRequests:
		typ = "rate_limit_exceeded"
	case status >= 500, status < 400:
		typ = "server_error" // a failing or misdirected upstream
	}
	return marshalError(upstreamStatusMessage(status), typ, "upstream_error")
}

// truthy reports whether a JSON value is one Python reads as true: not
// absent, null, false, 0, "", [] or {}.
func truthy(v json.RawMessage) bool {
	switch s := string(bytes.TrimSpace(v)); s {
	case "", "null", "false", `""`:
		return false
	default:
		var f float64
		if json.Unmarshal(v, &f) == nil {
			return f != 0
		}
		var x any
		if json.Unmarshal(v, &x) != nil {
			return false
		}
		switch x := x.(type) {
		case []any:
			return len(x) > 0
		case map[string]any:
			return len(x) > 0
		}
		return true
	}
}

// upstreamStatusMessage is the default message of an upstream's error
// answer on a committed stream, in either API's error object.
func upstreamStatusMessage(status int) string {
	msg := "The upstream server answered with status " + strconv.Itoa(status)
	if text := http.StatusText(status); text != "" {
		msg += " " + text
	}
	return msg + "."
}
