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
	// CostMaxTokens charges the body's max_tokens for each completion
	// it asks for (jsonscan.Fields.Completions), at the grant.
	CostMaxTokens = "max_tokens"
	// CostTime charges the seconds the request holds its permit: an
	// estimate at the grant (the handler's moving average of recent
	// holds), corrected to the real hold at the release.
	CostTime = "time"
	// CostTokens charges tokens: at the grant the request's weight (its
	// prompt estimate plus its completion budget, as kv_tokens counts
	// it), corrected at the release to the response's usage.total_tokens.
	CostTokens = "tokens"
)

// costModes are the values of Handler.Cost ("" is CostRequests).
var costModes = []string{CostRequests, CostMaxTokens, CostTime, CostTokens}

// takesMax reports whether a cost mode has a max (Handler.MaxCost).
func takesMax(mode string) bool { return mode == CostMaxTokens || mode == CostTokens }

const (
	// holdAlpha is the weight of the newest hold in the moving average
	// of cost time; holdSeed its value before the first hold.
	holdAlpha = 0.2
	holdSeed  = 1.0
	// minHoldEstimate keeps the estimate positive (the engine reads a
	// cost of 0 as 1) after a long run of near-instant holds.
	minHoldEstimate = 1e-6
)

// tokensEstimate is the cost of a request with cost tokens at enqueue:
// its weight in tokens (w: its prompt estimate plus its completion
// budget, the most it may use), bounded to 1..maxCost. The charge is
// corrected to the answer's usage at the release; until then a tenant
// is charged what its running requests may use at most.
func tokensEstimate(w weight, maxCost int) float64 {
	return float64(min(max(w.tokens(), 1), maxCost))
}

// holdAverage is the exponentially weighted moving average of the
// seconds the requests of one handler held their permit (the estimate
// cost time charges at the grant). Safe for concurrent use.
type holdAverage struct {
	mu   sync.Mutex
	secs float64
	seen bool
}

// estimate returns the average, the seed before the first observation.
func (a *holdAverage) estimate() float64 {
	a.mu.Lock()
	defer a.mu.Unlock()
	if !a.seen {
		return holdSeed
	}
	return max(a.secs, minHoldEstimate)
}

// observe adds one observation (seconds held).
func (a *holdAverage) observe(secs float64) {
	if !(secs >= 0) || math.IsInf(secs, 0) {
		return
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if !a.seen {
		a.secs, a.seen = holdSeed, true
	}
	a.secs += holdAlpha * (secs - a.secs)
}

// requestCost is the engine cost of a request at enqueue; 0 is the
// engine's default, 1. Cost tokens is set once the queue is known
// (call.weigh), as it estimates the prompt with the queue's ratio.
func (h *Handler) requestCost(info jsonscan.Fields) float64 {
	switch h.Cost {
	case CostMaxTokens:
		// Each completion may generate max_tokens: "n": 50 is fifty
		// answers' worth, as kv_tokens and cost tokens weigh it.
		n := max(info.Completions, 1)
		tokens := max(info.MaxTokens, 1)
		if tokens > int64(h.MaxCost)/n {
			return float64(h.MaxCost)
		}
		return float64(min(tokens*n, int64(h.MaxCost)))
	case CostTime:
		return h.hold.estimate()
	}
	return 0
}

// charge tells the permit what its request really used, just before its
// release: nothing, whatever the cost, when it was never forwarded (its
// client left as it was granted, or took nothing: it ran nowhere); with
// cost time the seconds from the grant to now (and the moving average
// learns them); with cost tokens the response's usage.total_tokens,
// bounded to MaxCost, if the response had one. Otherwise the estimate
// charged at the grant stands.
func (h *Handler) charge(p *fairqueue.Permit, granted time.Time, forwarded bool, uw *usageWriter) {
	if p == nil || p.FailOpen() {
		return
	}
	if !forwarded {
		h.chargePermit(p, 0)
		return
	}
	switch h.Cost {
	case CostTime:
		held := time.Since(granted).Seconds()
		h.hold.observe(held)
		h.chargePermit(p, held)
	case CostTokens:
		if uw == nil {
			return
		}
		if total, ok := uw.totalTokens(); ok {
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
