package caddyfairqueue

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"math"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"time"
)

// bodyChunk is the most readBody allocates for a body before its bytes
// arrive, whatever length the client declared: the buffer grows with the
// bytes received, so that a client that declares a large body and sends
// a few bytes costs a few bytes.
const bodyChunk = 64 << 10

// minBodyTimeout is the shortest body_timeout.
const minBodyTimeout = 100 * time.Millisecond

// errBodyTimeout: the body did not arrive within body_timeout.
var errBodyTimeout = errors.New("request body not received within body_timeout")

// readBody reads the whole request body, at most limit bytes within
// timeout, and puts the same bytes back for the handlers after this one
// (reverse_proxy sends them upstream with a known Content-Length).
//
// Reading first matters: Go's HTTP/1.1 server notices that a client went
// away only once the handler has read the request body to EOF, so a
// queued request with an unread body would hold its place, and later a
// permit, for nobody. A body larger than limit gives an
// *http.MaxBytesError; one that does not arrive within timeout,
// errBodyTimeout (the connection is then unusable: answer it and let it
// close).
func readBody(w http.ResponseWriter, r *http.Request, limit int64, timeout time.Duration) ([]byte, error) {
	if r.Body == nil || r.Body == http.NoBody {
		return nil, nil
	}
	if r.ContentLength > limit {
		return nil, &http.MaxBytesError{Limit: limit}
	}
	d := startBodyDeadline(w, r.Body, timeout)
	// MaxBytesReader also tells the server to close the connection
	// after the answer, rather than read the rest of a huge body.
	b, err := readGrowing(http.MaxBytesReader(w, r.Body, limit), r.ContentLength, limit)
	if err != nil {
		if d.expired(err) {
			return nil, errBodyTimeout
		}
		return nil, err
	}
	d.lift()
	r.Body = io.NopCloser(bytes.NewReader(b))
	r.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(b)), nil }
	r.ContentLength = int64(len(b))
	r.TransferEncoding = nil
	r.Header.Set("Content-Length", strconv.Itoa(len(b)))
	return b, nil
}

// readGrowing reads src to EOF into a buffer that grows as bytes
// arrive: it starts at no more than bodyChunk and doubles when full, up
// to room for the declared length (-1: unknown) or limit, plus one byte
// for the read that finds EOF, so that a body of the declared length
// never needs a larger buffer than itself.
func readGrowing(src io.Reader, declared, limit int64) ([]byte, error) {
	bound := limit
	if declared >= 0 {
		bound = declared
	}
	bound = min(bound, math.MaxInt64-1) + 1 // the EOF read
	b := make([]byte, 0, min(bound, bodyChunk))
	for {
		if len(b) == cap(b) {
			size := min(2*int64(cap(b)), bound)
			if size <= int64(cap(b)) { // more than declared: not from net/http
				size = 2 * int64(cap(b))
			}
			b = append(make([]byte, 0, size), b...)
		}
		n, err := src.Read(b[len(b):cap(b)])
		b = b[:len(b)+n]
		if err == io.EOF {
			return b, nil
		}
		if err != nil {
			return nil, err
		}
	}
}

// bodyDeadline bounds the read of a request body: a read deadline on the
// connection (HTTP/1, HTTP/2 and HTTP/3 all take one; with Caddy's read
// idle timeout it caps that one), or, for a ResponseWriter that cannot
// set one, a timer that closes the body.
type bodyDeadline struct {
	rc    *http.ResponseController // nil: the timer
	timer *time.Timer
	fired atomic.Bool
}

func startBodyDeadline(w http.ResponseWriter, body io.Closer, timeout time.Duration) *bodyDeadline {
	d := &bodyDeadline{rc: http.NewResponseController(w)}
	if d.rc.SetReadDeadline(time.Now().Add(timeout)) == nil {
		return d
	}
	d.rc = nil
	d.timer = time.AfterFunc(timeout, func() {
		d.fired.Store(true)
		_ = body.Close()
	})
	return d
}

// expired reports whether err, the failed read of the body, is the
// deadline's doing. The deadline stays: an expired one makes the
// server close the connection at once rather than wait for the rest of
// the body.
func (d *bodyDeadline) expired(err error) bool {
	if d.timer != nil {
		d.timer.Stop()
	}
	return errors.Is(err, os.ErrDeadlineExceeded) || d.fired.Load()
}

// lift removes the deadline once the body is read: the response, a
// stream perhaps, may last much longer. (Go's HTTP/1 server clears the
// connection's deadline itself at the body's end, before it watches the
// connection for a client that leaves, and Caddy's read idle timeout
// does too; a deadline left behind would be a trap for whatever reads
// or sets it next.)
func (d *bodyDeadline) lift() {
	if d.timer != nil {
		d.timer.Stop()
		return
	}
	_ = d.rc.SetReadDeadline(time.Time{})
}

// bodyInfo is what the handler reads from a JSON request body.
type bodyInfo struct {
	stream bool   // "stream": true
	model  string // "model": "<string>"
	// maxTokens is the largest of "max_tokens", "max_completion_tokens"
	// (OpenAI chat) and "max_output_tokens" (Responses API) that is a
	// positive number, rounded up, saturated at 1<<53; 0 if none.
	maxTokens int64
}

// sniffBody reads the top-level keys "stream", "model" and the max
// tokens keys of a JSON object body. Anything else (not JSON, malformed
// JSON, another top-level type) gives the zero bodyInfo: the request is
// then not streaming, has no model and no max tokens, and is still
// served. Keys may come in any order; for a repeated key the last one
// counts, as in most JSON parsers.
func sniffBody(b []byte) bodyInfo {
	b = bytes.TrimLeft(b, " \t\r\n")
	if len(b) == 0 || b[0] != '{' || !validJSON(b) {
		return bodyInfo{}
	}
	// b is valid JSON from here on: the scanner only needs to find where
	// each top-level member starts and ends.
	var info bodyInfo
	var tokens [3]int64 // by key, so that a repeated key replaces its own value
	done := func() bodyInfo {
		info.maxTokens = max(tokens[0], tokens[1], tokens[2])
		return info
	}
	s := scanner{b: b, i: 1}
	for {
		s.space()
		if s.peek() != '"' { // '}' of an empty object
			return done()
		}
		key := s.str()
		s.space()
		s.i++ // ':'
		s.space()
		start := s.i
		s.value()
		val := b[start:s.i]
		switch unquote(key) {
		case "stream":
			info.stream = string(val) == "true"
		case "model":
			info.model = ""
			if val[0] == '"' {
				info.model = unquote(val)
			}
		case "max_tokens":
			tokens[0] = tokenCount(val)
		case "max_completion_tokens":
			tokens[1] = tokenCount(val)
		case "max_output_tokens":
			tokens[2] = tokenCount(val)
		}
		s.space()
		if s.peek() != ',' {
			return done()
		}
		s.i++
	}
}

// maxTokenCount saturates a token count read from a body: beyond it a
// float64 no longer holds every integer, and every cost bound is far
// below it.
const maxTokenCount = 1 << 53

// tokenCount reads a JSON number token as a positive token count, 0 for
// anything else (a string, null, zero, a negative number).
func tokenCount(val []byte) int64 {
	if len(val) == 0 || (val[0] != '-' && (val[0] < '0' || val[0] > '9')) {
		return 0
	}
	f, err := strconv.ParseFloat(string(val), 64)
	if err != nil && !errors.Is(err, strconv.ErrRange) { // 1e999 saturates
		return 0
	}
	if !(f > 0) {
		return 0
	}
	return int64(math.Ceil(min(f, maxTokenCount)))
}

// scanner walks a valid JSON document.
type scanner struct {
	b []byte
	i int
}

func (s *scanner) peek() byte {
	if s.i < len(s.b) {
		return s.b[s.i]
	}
	return 0
}

func (s *scanner) space() {
	for s.i < len(s.b) {
		switch s.b[s.i] {
		case ' ', '\t', '\r', '\n':
			s.i++
		default:
			return
		}
	}
}

// str consumes a string and returns it with its quotes. The body is
// valid JSON: the string ends at the first quote not escaped by an odd
// number of backslashes.
func (s *scanner) str() []byte {
	start := s.i
	s.i++ // opening quote
	for {
		j := bytes.IndexByte(s.b[s.i:], '"')
		if j < 0 {
			s.i = len(s.b)
			return s.b[start:]
		}
		s.i += j + 1
		escapes := 0
		for k := s.i - 2; k > start && s.b[k] == '\\'; k-- {
			escapes++
		}
		if escapes%2 == 0 {
			return s.b[start:s.i]
		}
	}
}

// value consumes one value of any type.
func (s *scanner) value() {
	switch s.peek() {
	case '"':
		s.str()
	case '{', '[':
		depth := 0
		for s.i < len(s.b) {
			switch s.b[s.i] {
			case '"':
				s.str()
				continue
			case '{', '[':
				depth++
			case '}', ']':
				depth--
			}
			s.i++
			if depth == 0 {
				return
			}
		}
	default: // number, true, false, null
		for s.i < len(s.b) {
			switch s.b[s.i] {
			case ',', '}', ']', ' ', '\t', '\r', '\n':
				return
			}
			s.i++
		}
	}
}

// unquote decodes a JSON string token (quotes included).
func unquote(tok []byte) string {
	if !bytes.ContainsRune(tok, '\\') {
		// As encoding/json does: invalid UTF-8 becomes U+FFFD.
		return strings.ToValidUTF8(string(tok[1:len(tok)-1]), "\uFFFD")
	}
	var s string
	_ = json.Unmarshal(tok, &s)
	return s
}

// wantsEventStream reports whether the client asked for server-sent
// events in its Accept header.
func wantsEventStream(r *http.Request) bool {
	for _, v := range r.Header.Values("Accept") {
		if strings.Contains(strings.ToLower(v), "text/event-stream") {
			return true
		}
	}
	return false
}
