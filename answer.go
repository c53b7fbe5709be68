package caddyfairqueue

import (
	"bytes"
	"encoding/json"
	"errors"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// What the handler writes itself rather than the upstream: OpenAI-style
// error bodies, and server-sent events (a reject to a streaming request,
// and everything once sse_keepalive has sent the header).

// apiError is an OpenAI-style error answer.
type apiError struct {
	Error apiErrorObject `json:"error"`
}

type apiErrorObject struct {
	Message string `json:"message"`
	Type    string `json:"type"`
	Code    string `json:"code"`
}

// marshalError is the JSON of an OpenAI-style error.
func marshalError(message, typ, code string) []byte {
	return encodeJSON(apiError{Error: apiErrorObject{Message: message, Type: typ, Code: code}})
}

// encodeJSON is json.Marshal without its HTML escaping: a message or a
// placeholder's value keeps its <, > and & as they are.
func encodeJSON(v any) []byte {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(v)
	return bytes.TrimSuffix(buf.Bytes(), []byte("\n"))
}

// writeJSON answers with status and a JSON body.
func writeJSON(w http.ResponseWriter, status int, body []byte) error {
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Content-Length", strconv.Itoa(len(body)))
	w.WriteHeader(status)
	_, err := w.Write(body)
	return err
}

// writeTooLarge answers a request whose body exceeds max_body.
func writeTooLarge(w http.ResponseWriter, a api, limit int64) {
	msg := "The request body is larger than the " + formatBytes(limit) + " this endpoint accepts."
	_ = writeJSON(w, http.StatusRequestEntityTooLarge, a.errorBody(msg, "invalid_request_error", "request_too_large"))
}

// writeBodyTimeout answers a request whose body did not arrive within
// body_timeout. The rest of the body will not be read: an HTTP/1
// connection closes after the answer (HTTP/2 and HTTP/3 end the stream
// alone).
func writeBodyTimeout(w http.ResponseWriter, r *http.Request, a api, timeout time.Duration) {
	if r.ProtoMajor == 1 {
		w.Header().Set("Connection", "close")
	}
	msg := "The request body did not arrive within " + timeout.String() + "."
	_ = writeJSON(w, http.StatusRequestTimeout, a.errorBody(msg, "invalid_request_error", "request_timeout"))
}

// writeTooEarly answers a request that came in TLS early data and
// names a tenant (inEarlyData): 425 Too Early, which tells its client to
// send it again once the handshake is done (RFC 8470), as Caddy's
// remote_ip matcher answers such a request.
func writeTooEarly(w http.ResponseWriter, a api) {
	msg := "The request came in TLS early data; send it again once the handshake is complete."
	_ = writeJSON(w, http.StatusTooEarly, a.errorBody(msg, "invalid_request_error", "too_early"))
}

// writeAmbiguousModel answers a request whose body names one model as a
// Python backend reads it and another as a Go one does ("model" and
// "MODEL"): 400, before any queue.
func writeAmbiguousModel(w http.ResponseWriter, a api) {
	msg := "The request body names its model more than once, in different spellings of \"model\"."
	_ = writeJSON(w, http.StatusBadRequest, a.errorBody(msg, "invalid_request_error", "ambiguous_model"))
}

// writeAmbiguousStream answers a request whose body asks for a streamed
// answer as one kind of backend reads it and not as the other does
// ("stream" and "STREAM"): 400, before any queue.
func writeAmbiguousStream(w http.ResponseWriter, a api) {
	msg := "The request body sets \"stream\" more than once, in different spellings and to different values."
	_ = writeJSON(w, http.StatusBadRequest, a.errorBody(msg, "invalid_request_error", "ambiguous_stream"))
}

// formatBytes writes n in the largest binary unit that divides it.
func formatBytes(n int64) string {
	for _, u := range []struct {
		size int64
		name string
	}{{1 << 30, "GiB"}, {1 << 20, "MiB"}, {1 << 10, "KiB"}} {
		if n >= u.size && n%u.size == 0 {
			return strconv.FormatInt(n/u.size, 10) + " " + u.name
		}
	}
	return strconv.FormatInt(n, 10) + " bytes"
}

// sseEvent frames one server-sent event; each line of data becomes a
// data field, as the SSE format requires.
func sseEvent(event, data string) []byte {
	var b bytes.Buffer
	b.WriteString("event: ")
	b.WriteString(event)
	b.WriteByte('\n')
	data = strings.ReplaceAll(data, "\r\n", "\n")
	for line := range strings.SplitSeq(data, "\n") {
		b.WriteString("data: ")
		b.WriteString(strings.TrimSuffix(line, "\r"))
		b.WriteByte('\n')
	}
	b.WriteByte('\n')
	return b.Bytes()
}

// writeEvent writes one server-sent event and flushes it.
func writeEvent(w http.ResponseWriter, event, data string) error {
	return writeFrame(w, sseEvent(event, data))
}

// writeFrame writes one frame of a stream (an event, a line) and
// flushes it.
func writeFrame(w http.ResponseWriter, frame []byte) error {
	if _, err := w.Write(frame); err != nil {
		return err
	}
	return flush(w)
}

// flush sends what w buffered; a writer that cannot flush is no error.
func flush(w http.ResponseWriter) error {
	err := http.NewResponseController(w).Flush()
	if errors.Is(err, http.ErrNotSupported) {
		return nil
	}
	return err
}
