package caddyfairqueue

import (
	"bytes"
	"cmp"
	"encoding/json"
	"io"
	"maps"
	"math"
	"mime"
	"net/http"
	"slices"
	"strings"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
)

// The ResponseWriters that next writes a granted request's answer to:
// holdWriter (a pool's upstream, whose refusal never reaches the
// client), committedWriter (a stream the keepalive committed),
// usageWriter (cost tokens, kv_tokens: reads the answer's usage on the
// side) and firstByteWriter (firstbyte.go: the upstream's time to first
// byte).

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
	wrote    bool   // status or body reached the client
	onHold   func() // called as a status is held (heldBound); nil: none
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
		if hw.onHold != nil {
			hw.onHold()
		}
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

// maxUpstreamErrorBody bounds the error body of an upstream that the
// relay turns into an SSE error event; a longer one is replaced by the
// default error object.
const maxUpstreamErrorBody = 64 << 10

// committedWriter is the next handler's ResponseWriter once the header
// of the response is sent: it keeps the upstream's header and status to
// itself, relays a 2xx body with a flush after every write, and holds
// any other (an error, a redirect) back for the SSE error event. It
// hides the writer beneath (no Unwrap), so that nothing hijacks or
// re-heads a stream that is already running.
type committedWriter struct {
	w        http.ResponseWriter
	header   http.Header // the upstream's, never sent
	status   int         // the upstream's; 0 until known
	errBody  bytes.Buffer
	wrote    bool      // body bytes reached the client
	onStatus func(int) // called with the status once known (heldBound); nil: none
}

func (cw *committedWriter) Header() http.Header { return cw.header }

// WriteHeader records the upstream's status; informational ones (103
// Early Hints) are dropped.
func (cw *committedWriter) WriteHeader(code int) {
	if code >= 200 && cw.status == 0 {
		cw.status = code
		if cw.onStatus != nil {
			cw.onStatus(code)
		}
	}
}

func (cw *committedWriter) Write(b []byte) (int, error) {
	if cw.status == 0 {
		cw.WriteHeader(http.StatusOK)
	}
	if failed(cw.status) {
		if room := maxUpstreamErrorBody + 1 - cw.errBody.Len(); room > 0 {
			cw.errBody.Write(b[:min(len(b), room)])
		}
		return len(b), nil
	}
	n, err := cw.w.Write(b)
	if n > 0 {
		cw.wrote = true
	}
	if err != nil {
		return n, err
	}
	return n, flush(cw.w)
}

// FlushError implements the flusher of http.ResponseController.
func (cw *committedWriter) FlushError() error {
	if failed(cw.status) {
		return nil
	}
	return flush(cw.w)
}

// Bounds of the usage extractor's memory.
const (
	// maxSSELine is the longest SSE line read whole for usage; of a
	// longer data line only the last sseTail bytes are read
	// (readUsageTail), of another longer line nothing.
	maxSSELine = 64 << 10
	// maxJSONBody is the largest JSON response body read for usage; a
	// larger body gives no usage.
	maxJSONBody = 1 << 20
)

// What usageWriter reads from a response, set by its Content-Type.
const (
	usageUndecided = iota
	usageNone      // neither JSON nor SSE, or encoded (gzip...)
	usageJSON
	usageSSE
	usageNDJSON // Ollama's streams: one JSON object per line
)

// usageWriter passes a response through unchanged, as it is written
// (nothing is held back or delayed), and reads the response's
// usage.total_tokens on the side: from a JSON body (Content-Type
// application/json, at most maxJSONBody bytes) or from the last
// server-sent event whose data carries a usage object with total_tokens
// (Content-Type text/event-stream; each line up to maxSSELine bytes, of
// a longer data line its last sseTail bytes: readUsageTail). A
// Responses API answer's usage (response.usage) counts too, and so does
// an Ollama answer's prompt_eval_count + eval_count, in its JSON body or
// the last line of its NDJSON stream (application/x-ndjson). It reads the
// prompt tokens of the same usage (prompt_tokens, the Responses API's
// input_tokens, Ollama's prompt_eval_count) for the queue's prompt
// estimate. A response with a Content-Encoding gives none.
type usageWriter struct {
	*caddyhttp.ResponseWriterWrapper
	mode int

	body []byte // usageJSON: the body so far
	line []byte // usageSSE, usageNDJSON: the current line so far
	// The current line is beyond maxSSELine: line holds its tail (an
	// NDJSON line, an SSE data line) or nothing (another SSE line).
	long bool
	data bool // usageSSE: the long line is a data line

	total float64 // the last usage.total_tokens found
	found bool
	// The prompt tokens of the usage found (usage.prompt_tokens or
	// input_tokens; Ollama's prompt_eval_count), if it has them.
	promptUsed  float64
	promptFound bool
}

func newUsageWriter(w http.ResponseWriter) *usageWriter {
	return &usageWriter{ResponseWriterWrapper: &caddyhttp.ResponseWriterWrapper{ResponseWriter: w}}
}

// decide picks what to read from the response's header, once.
func (u *usageWriter) decide() {
	if u.mode != usageUndecided {
		return
	}
	u.mode = usageNone
	hdr := u.Header()
	if enc := hdr.Get("Content-Encoding"); enc != "" && !strings.EqualFold(enc, "identity") {
		return
	}
	mt, _, err := mime.ParseMediaType(hdr.Get("Content-Type"))
	if err != nil {
		return
	}
	switch mt {
	case "application/json":
		u.mode = usageJSON
	case "text/event-stream":
		u.mode = usageSSE
	case "application/x-ndjson":
		u.mode = usageNDJSON
	}
}

// WriteHeader decides at the final status (not at a 1xx).
func (u *usageWriter) WriteHeader(code int) {
	if code >= 200 {
		u.decide()
	}
	u.ResponseWriter.WriteHeader(code)
}

func (u *usageWriter) Write(b []byte) (int, error) {
	u.decide()
	n, err := u.ResponseWriter.Write(b)
	u.scan(b[:n])
	return n, err
}

// ReadFrom goes through Write while the response is read, so that no
// byte escapes the scan.
func (u *usageWriter) ReadFrom(r io.Reader) (int64, error) {
	u.decide()
	if u.mode == usageNone {
		return u.ResponseWriterWrapper.ReadFrom(r)
	}
	return io.Copy(writerOnly{u}, r)
}

// writerOnly hides a writer's ReadFrom from io.Copy.
type writerOnly struct{ io.Writer }

// FlushError flushes the writer beneath (http.ResponseController).
func (u *usageWriter) FlushError() error {
	return http.NewResponseController(u.ResponseWriter).Flush()
}

// Flush implements http.Flusher for handlers that assert it.
func (u *usageWriter) Flush() { _ = u.FlushError() }

func (u *usageWriter) scan(b []byte) {
	switch u.mode {
	case usageJSON:
		if u.body == nil && len(b) == 0 {
			return
		}
		if len(u.body)+len(b) > maxJSONBody {
			u.mode, u.body = usageNone, nil // too large: give up
			return
		}
		u.body = append(u.body, b...)
	case usageSSE, usageNDJSON:
		for len(b) > 0 {
			i := bytes.IndexAny(b, "\r\n")
			if i < 0 {
				u.keep(b)
				return
			}
			u.keep(b[:i])
			u.endLine()
			b = b[i+1:]
		}
	}
}

// keep adds part of the current line, up to maxSSELine. Of a longer
// line it keeps a tail (at least the last tailOf bytes, in at most
// maxSSELine: the buffer is moved only when full, so that a line written
// a byte at a time costs no more than one written at once): Ollama's
// last NDJSON line may carry the whole context (a token array) before
// its counts, and a Responses API response.completed event the whole
// response before its usage. Of a longer SSE line that is not a data
// line it keeps nothing.
func (u *usageWriter) keep(part []byte) {
	if u.long && u.mode == usageSSE && !u.data {
		return
	}
	if len(u.line)+len(part) <= maxSSELine {
		u.line = append(u.line, part...)
		return
	}
	if !u.long {
		u.long = true
		u.data = u.mode == usageSSE && u.startsData(part)
		if u.mode == usageSSE && !u.data {
			u.line = u.line[:0]
			return
		}
	}
	tail := u.tailOf()
	if len(part) >= tail {
		u.line = append(u.line[:0], part[len(part)-tail:]...)
		return
	}
	keep := tail - len(part)
	u.line = append(u.line[:0], u.line[max(0, len(u.line)-keep):]...)
	u.line = append(u.line, part...)
}

// startsData reports whether the current line, part added, is an SSE
// data line.
func (u *usageWriter) startsData(part []byte) bool {
	const field = "data:"
	n := min(len(u.line), len(field))
	return string(u.line[:n]) == field[:n] && bytes.HasPrefix(part, []byte(field[n:]))
}

// tailOf is how much of an over-long line is read.
func (u *usageWriter) tailOf() int {
	if u.mode == usageNDJSON {
		return ndjsonTail
	}
	return sseTail
}

// endLine reads a complete SSE line ("\r\n" ends one line, then an empty
// one: harmless).
func (u *usageWriter) endLine() {
	line, long, isData := u.line, u.long, u.data
	u.line, u.long, u.data = u.line[:0], false, false
	if long {
		line = line[max(0, len(line)-u.tailOf()):]
		switch {
		case u.mode == usageNDJSON:
			u.readCounts(line)
		case isData:
			u.readUsageTail(line)
		}
		return
	}
	if u.mode == usageNDJSON {
		u.read(line)
		return
	}
	data, ok := bytes.CutPrefix(line, []byte("data:"))
	if !ok {
		return
	}
	u.read(data)
}

// read records the usage of one JSON document, if it has one.
func (u *usageWriter) read(doc []byte) {
	// A cheap test first: most chunks have none.
	if !bytes.Contains(doc, []byte(`"total_tokens"`)) && !bytes.Contains(doc, []byte(`eval_count"`)) {
		return
	}
	var v struct {
		Usage *usageObject `json:"usage"`
		// The Responses API's response object; Ollama's generated text.
		Response json.RawMessage `json:"response"`
		// Ollama's last chunk, or its whole answer: the prompt's and
		// the answer's tokens.
		PromptEvalCount *float64 `json:"prompt_eval_count"`
		EvalCount       *float64 `json:"eval_count"`
	}
	if json.Unmarshal(doc, &v) != nil {
		return
	}
	usage := v.Usage
	if usage == nil && len(v.Response) > 0 && v.Response[0] == '{' {
		var r struct {
			Usage *usageObject `json:"usage"`
		}
		if json.Unmarshal(v.Response, &r) == nil {
			usage = r.Usage
		}
	}
	if usage == nil && (v.EvalCount != nil || v.PromptEvalCount != nil) {
		if (v.EvalCount != nil && !count(v.EvalCount)) || (v.PromptEvalCount != nil && !count(v.PromptEvalCount)) {
			return // not counts: their sum is none either
		}
		// An embedding's answer counts its input alone.
		total := ptrOr(v.EvalCount) + ptrOr(v.PromptEvalCount)
		usage = &usageObject{TotalTokens: &total, PromptTokens: v.PromptEvalCount}
	}
	if usage == nil || !count(usage.TotalTokens) {
		return
	}
	u.total, u.found = *usage.TotalTokens, true
	prompt := cmp.Or(usage.PromptTokens, usage.InputTokens)
	u.promptUsed, u.promptFound = ptrOr(prompt), count(prompt)
}

// count reports whether p is a token count: present, finite, not
// negative.
func count(p *float64) bool { return p != nil && *p >= 0 && !math.IsInf(*p, 0) }

func ptrOr(p *float64) float64 {
	if p == nil {
		return 0
	}
	return *p
}

type usageObject struct {
	TotalTokens  *float64 `json:"total_tokens"`
	PromptTokens *float64 `json:"prompt_tokens"`
	InputTokens  *float64 `json:"input_tokens"` // the Responses API's
}

// totalTokens returns the response's usage.total_tokens, once the whole
// response is written.
func (u *usageWriter) totalTokens() (float64, bool) {
	switch u.mode {
	case usageJSON:
		u.read(u.body)
		u.mode, u.body = usageNone, nil
	case usageSSE, usageNDJSON:
		if len(u.line) > 0 || u.long { // a last line without its newline
			u.endLine()
		}
	}
	return u.total, u.found
}

// promptTokens returns the prompt tokens of the response's usage, once
// the whole response is written.
func (u *usageWriter) promptTokens() (float64, bool) {
	u.totalTokens()
	return u.promptUsed, u.promptFound
}

// completionTokens returns the tokens the answer generated: its usage's
// total less its prompt tokens, when it has both.
func (u *usageWriter) completionTokens() (float64, bool) {
	total, ok := u.totalTokens()
	if !ok || !u.promptFound || total < u.promptUsed {
		return 0, false
	}
	return total - u.promptUsed, true
}

// Interface guards
var (
	_ http.Flusher = (*holdWriter)(nil)
	_ http.Flusher = (*usageWriter)(nil)
)
