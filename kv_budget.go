package caddyfairqueue

import (
	"math"
	"slices"
	"sync"

	"github.com/fair-queue/caddy-fair-queue/internal/jsonscan"
)

// A request whose body sets no completion budget is weighed with the
// budget its queue learned (budgetEstimator) unless the handler fixes
// one (Handler.DefaultMaxTokens): most chat clients send none, and a
// fixed 1024 for answers of a few hundred tokens would hold room in the
// KV-cache that nothing uses.

// Bounds of the learned completion budget.
const (
	// budgetWindow is how many of the latest answers the budget is a
	// quantile of.
	budgetWindow = 256
	// budgetMinSamples answers must be seen before the budget is
	// learned; DefaultMaxTokens applies until then.
	budgetMinSamples = 20
	// budgetQuantile of the answers' completion tokens is the budget:
	// few answers outgrow it, and those that do are outweighed by the
	// many that stop short of it (the cache holds what they generate,
	// not what they were budgeted).
	budgetQuantile = 0.95
	// budgetEvery: the quantile is computed again every budgetEvery
	// answers, not at each.
	budgetEvery = 8
)

// budgetEstimator learns the completion budget of a queue's requests
// whose body sets none: the budgetQuantile of the completion tokens
// (the answer's usage: total less prompt) of the last budgetWindow such
// answers, once budgetMinSamples are seen. Each engine (queue, on this
// instance) has its own, kept across reloads. Safe for concurrent use.
type budgetEstimator struct {
	mu      sync.Mutex
	window  [budgetWindow]int64
	samples int64 // answers learned
	budget  int64 // the quantile last computed; 0 until budgetMinSamples
}

// get is the learned budget, or def while too few answers are seen.
func (e *budgetEstimator) get(def int64) int64 {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.budget == 0 {
		return def
	}
	return e.budget
}

// state is the learned budget (0: not yet) and the answers learned.
func (e *budgetEstimator) state() (budget, samples int64) {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.budget, e.samples
}

// observe learns one answer that generated tokens tokens, saturated at
// jsonscan.MaxTokenCount as a body's budget is (a float beyond int64's
// range converts to no defined int64).
func (e *budgetEstimator) observe(tokens float64) {
	if !(tokens >= 0) || math.IsInf(tokens, 0) {
		return
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	e.window[e.samples%budgetWindow] = int64(math.Ceil(min(tokens, jsonscan.MaxTokenCount)))
	e.samples++
	if e.samples < budgetMinSamples || (e.samples != budgetMinSamples && e.samples%budgetEvery != 0) {
		return
	}
	seen := slices.Clone(e.window[:min(e.samples, budgetWindow)])
	slices.Sort(seen)
	k := int(math.Ceil(budgetQuantile*float64(len(seen)))) - 1
	e.budget = max(seen[k], 1)
}
