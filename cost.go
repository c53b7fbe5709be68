package caddyfairqueue

import (
	"math"
	"sync"
	"time"

	"github.com/fair-queue/caddy-fair-queue/fairqueue"
	"github.com/fair-queue/caddy-fair-queue/internal/jsonscan"
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
func tokensEstimate(bodyLen int, info jsonscan.Fields, expected float64, maxCost int) float64 {
	completion := expected
	if info.MaxTokens > 0 {
		completion = min(completion, float64(info.MaxTokens))
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
func (h *Handler) requestCost(bodyLen int, info jsonscan.Fields) float64 {
	switch h.Cost {
	case CostMaxTokens:
		return float64(min(max(info.MaxTokens, 1), int64(h.MaxCost)))
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
