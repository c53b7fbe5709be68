package caddyfairqueue

import (
	"bytes"
	"encoding/json"
	"io"
	"math"
	"mime"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
)

// Cost modes (Handler.Cost): what a request is charged to its tenant.
const (
	// CostRequests charges every request 1 (the default; also "").
	CostRequests = "requests"
	// CostMaxTokens charges the body's max_tokens, at the grant.
	CostMaxTokens = "max_tokens"
	// CostTime charges the seconds the request holds its permit: an
	// estimate at the grant (the handler's moving average of recent
	// holds), corrected to the real hold at the release.
	CostTime = "time"
	// CostTokens charges tokens: an estimate at the grant from the prompt
	// size and max_tokens, corrected at the release to the response's
	// usage.total_tokens.
	CostTokens = "tokens"
)

// costModes are the values of Handler.Cost ("" is CostRequests).
var costModes = []string{CostRequests, CostMaxTokens, CostTime, CostTokens}

// takesMax reports whether a cost mode has a max (Handler.MaxCost).
func takesMax(mode string) bool { return mode == CostMaxTokens || mode == CostTokens }

const (
	// defaultCompletionTokens is what cost tokens expects a request to
	// generate before it has seen an answer's usage.
	defaultCompletionTokens = 1024
	// promptBytesPerToken: cost tokens counts ceil(body bytes / 4)
	// tokens of prompt, the usual rule of thumb for English text.
	promptBytesPerToken = 4
	// holdAlpha is the weight of the newest hold in the moving average
	// of cost time; holdSeed its value before the first hold.
	holdAlpha = 0.2
	holdSeed  = 1.0
	// minHoldEstimate keeps the estimate positive (the engine reads a
	// cost of 0 as 1) after a long run of near-instant holds.
	minHoldEstimate = 1e-6
)

// promptTokens is cost tokens' count of a prompt: ceil(request body
// bytes / 4) (the whole body: messages, system prompt, tools and JSON
// punctuation alike).
func promptTokens(bodyLen int) float64 {
	return float64((int64(bodyLen) + promptBytesPerToken - 1) / promptBytesPerToken)
}

// tokensEstimate is the cost of a request with cost tokens at enqueue:
// its prompt tokens plus the completion expected (the handler's moving
// average of the completions it saw, defaultCompletionTokens before the
// first), at most the body's max_tokens when it sets one; bounded to
// 1..maxCost. An estimate close to the real use keeps a tenant's
// counter honest while its requests run: a returning tenant starts at
// the others' counters, which hold what their running requests were
// charged.
func tokensEstimate(bodyLen int, info bodyInfo, expected float64, maxCost int) float64 {
	completion := expected
	if info.maxTokens > 0 {
		completion = min(completion, float64(info.maxTokens))
	}
	return min(max(math.Ceil(promptTokens(bodyLen)+completion), 1), float64(maxCost))
}

// holdAverage is the exponentially weighted moving average of what the
// requests of one handler used: the seconds they held their permit (the
// estimate cost time charges at the grant), or the tokens they generated
// (cost tokens, with seed defaultCompletionTokens). Safe for concurrent
// use.
type holdAverage struct {
	// seed is the estimate before the first observation; 0: holdSeed.
	seed float64
	mu   sync.Mutex
	secs float64
	seen bool
}

func (a *holdAverage) seedValue() float64 {
	if a.seed > 0 {
		return a.seed
	}
	return holdSeed
}

// estimate returns the average, the seed before the first observation.
func (a *holdAverage) estimate() float64 {
	a.mu.Lock()
	defer a.mu.Unlock()
	if !a.seen {
		return a.seedValue()
	}
	return max(a.secs, minHoldEstimate)
}

// observe adds one observation (seconds held, tokens generated).
func (a *holdAverage) observe(secs float64) {
	if !(secs >= 0) || math.IsInf(secs, 0) {
		return
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if !a.seen {
		a.secs, a.seen = a.seedValue(), true
	}
	a.secs += holdAlpha * (secs - a.secs)
}

// requestCost is the engine cost of a request at enqueue; 0 is the
// engine's default, 1.
func (h *Handler) requestCost(bodyLen int, info bodyInfo) float64 {
	switch h.Cost {
	case CostMaxTokens:
		return float64(min(max(info.maxTokens, 1), int64(h.MaxCost)))
	case CostTokens:
		return tokensEstimate(bodyLen, info, h.completion.estimate(), h.MaxCost)
	case CostTime:
		return h.hold.estimate()
	}
	return 0
}

// charge tells the permit what its request really used, just before its
// release: with cost time the seconds from the grant to now (and the
// moving average learns them, when the request was forwarded); with cost
// tokens the response's usage.total_tokens, bounded to MaxCost, if the
// response had one. Otherwise the estimate charged at the grant stands.
func (h *Handler) charge(p *fairqueue.Permit, granted time.Time, forwarded bool, uw *usageWriter) {
	if p == nil || p.FailOpen() {
		return
	}
	switch h.Cost {
	case CostTime:
		held := time.Since(granted).Seconds()
		if forwarded {
			h.hold.observe(held)
		}
		h.chargePermit(p, held)
	case CostTokens:
		if uw == nil {
			return
		}
		if total, ok := uw.totalTokens(); ok {
			h.completion.observe(max(total-uw.prompt, 0))
			h.chargePermit(p, min(total, float64(h.MaxCost)))
		}
	}
}

func (h *Handler) chargePermit(p *fairqueue.Permit, used float64) {
	p.Charge(used)
	if h.charged != nil {
		h.charged(used)
	}
}

// Bounds of the usage extractor's memory.
const (
	// maxSSELine is the longest SSE line read for usage; the rest of a
	// longer line is not kept (that line is ignored).
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
)

// usageWriter passes a response through unchanged, as it is written
// (nothing is held back or delayed), and reads the response's
// usage.total_tokens on the side: from a JSON body (Content-Type
// application/json, at most maxJSONBody bytes) or from the last
// server-sent event whose data carries a usage object with total_tokens
// (Content-Type text/event-stream; each line up to maxSSELine bytes). A
// Responses API answer's usage (response.usage) counts too. A response
// with a Content-Encoding gives none.
type usageWriter struct {
	*caddyhttp.ResponseWriterWrapper
	mode int

	body []byte // usageJSON: the body so far
	line []byte // usageSSE: the current line so far
	long bool   // usageSSE: the current line is beyond maxSSELine, ignored

	total float64 // the last usage.total_tokens found
	found bool

	prompt float64 // the request's prompt tokens (promptTokens)
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
	case usageSSE:
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

// keep adds part of the current SSE line, up to maxSSELine.
func (u *usageWriter) keep(part []byte) {
	if u.long {
		return
	}
	if len(u.line)+len(part) > maxSSELine {
		u.long, u.line = true, u.line[:0]
		return
	}
	u.line = append(u.line, part...)
}

// endLine reads a complete SSE line ("\r\n" ends one line, then an empty
// one: harmless).
func (u *usageWriter) endLine() {
	line, long := u.line, u.long
	u.line, u.long = u.line[:0], false
	if long {
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
	if !bytes.Contains(doc, []byte(`"total_tokens"`)) { // cheap test first: most chunks have none
		return
	}
	var v struct {
		Usage    *usageObject `json:"usage"`
		Response *struct {
			Usage *usageObject `json:"usage"`
		} `json:"response"`
	}
	if json.Unmarshal(doc, &v) != nil {
		return
	}
	usage := v.Usage
	if usage == nil && v.Response != nil {
		usage = v.Response.Usage
	}
	if usage == nil || usage.TotalTokens == nil || !(*usage.TotalTokens >= 0) || math.IsInf(*usage.TotalTokens, 0) {
		return
	}
	u.total, u.found = *usage.TotalTokens, true
}

type usageObject struct {
	TotalTokens *float64 `json:"total_tokens"`
}

// totalTokens returns the response's usage.total_tokens, once the whole
// response is written.
func (u *usageWriter) totalTokens() (float64, bool) {
	switch u.mode {
	case usageJSON:
		u.read(u.body)
		u.mode, u.body = usageNone, nil
	case usageSSE:
		if len(u.line) > 0 || u.long { // a last line without its newline
			u.endLine()
		}
	}
	return u.total, u.found
}
