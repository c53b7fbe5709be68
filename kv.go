package caddyfairqueue

import (
	"math"
	"net/http"
	"strings"
	"sync"

	"github.com/fair-queue/caddy-fair-queue/internal/jsonscan"
)

// A request's weight in KV-cache tokens (Handler.KVTokens) is what it
// holds in the backend's cache at most: its prompt's tokens plus the
// tokens it may generate, in each of its completions (n, best_of, a
// batch of prompts: jsonscan.Fields.Completions). The prompt's are
// estimated from its text (jsonscan.Fields.PromptBytes) and the bytes
// per token that its queue learned from the answers' usage
// (promptEstimator), plus Handler.MediaTokens for each of its images and
// audio parts (jsonscan.Fields.Media); the tokens each completion may generate are its
// body's budget (max_completion_tokens and the like,
// jsonscan.Fields.Budget, or Ollama's num_predict on its native API), else Handler.DefaultMaxTokens where set, else
// the budget its queue learned (budgetEstimator, kv_budget.go), else
// DefaultMaxTokens.

// DefaultMediaTokens is the prompt tokens each image, audio clip or
// other part of a prompt that is not text is weighed at, unless
// Handler.MediaTokens says otherwise: about what a vision model served
// by vLLM makes of a picture (LLaVA 1.5 576 tokens, Qwen2.5-VL about
// 1,300 for a 1024x1024 image, Pixtral up to 4,096, Gemma 3 256), and
// of 30 seconds of audio (Qwen2-Audio 750).
const DefaultMediaTokens = 1024

// Bounds of the estimator's ratio, in bytes of prompt text per token.
const (
	// seedBytesPerToken is the ratio before any answer is seen: the usual
	// rule of thumb for English text.
	seedBytesPerToken = 4
	// A sample outside [minBytesPerToken, maxBytesPerToken] is not
	// learned: a prompt served from a prefix cache whose count leaves the
	// cached tokens out, a short text dwarfed by the chat template, or a
	// backend that counts otherwise.
	minBytesPerToken = 1
	maxBytesPerToken = 16
	// bytesPerTokenAlpha is the weight of the newest sample in the moving
	// averages once they span 1/bytesPerTokenAlpha samples; before, the
	// n-th sample weighs 1/(n+bytesPerTokenStart), so that the first
	// answers move the seed fast.
	bytesPerTokenAlpha = 0.01
	bytesPerTokenStart = 10
	// maxSampleShare is the most one sample may add to the averages, as
	// a share of what they hold: a sample of more tokens is learned at
	// its ratio, but as that many tokens. One answer then
	// moves the ratio at most a tenth of the way to its own, however
	// long its prompt: a client cannot swing the estimate of every
	// client's prompts with one huge prompt of text that tokenizes
	// unusually (padding of spaces, a list of numbers).
	maxSampleShare = 0.1
)

// weight is a request's weight in KV-cache tokens, and what it is made
// of.
type weight struct {
	// text is the bytes of the prompt's text, or of the whole body when
	// it names no prompt (noPrompt).
	text     int64
	noPrompt bool
	// ids is the prompt's tokens sent as token ids
	// (jsonscan.Fields.PromptTokens), counted as they are (with
	// noPrompt, at least: the body's text holds them).
	ids int64
	// media is the prompt's parts that are not text (an image, audio;
	// jsonscan.Fields.Media), which the backend counts and text does
	// not, and mediaTokens the tokens they weigh together.
	media, mediaTokens int64
	// reasoning: text holds an assistant message's reasoning
	// (jsonscan.Fields.Reasoning), which the backend may not count.
	reasoning bool
	budget    int64 // the completion budget, of each completion
	// completions is how many completions the backend generates, each
	// up to the budget (jsonscan.Fields.Completions): at least 1.
	completions int64
	prompt      int64 // the prompt's estimated tokens: ceil(text / bytes per token) + ids + mediaTokens
	// open: the body sets no budget, and the queue's learned one applies
	// (learnBudget); budget is the default until weigh.
	open bool
}

// generates reports whether r, of API a, asks TGI's or SGLang's native
// generation (/generate, TGI's /generate_stream; Ollama's /api/generate
// is an API of its own), whose body sets its budget and completions in
// an object of their own (jsonscan.Fields.NewTokens, NewCompletions).
func generates(r *http.Request, a api) bool {
	if a.ollama() {
		return false
	}
	return strings.HasSuffix(strings.TrimSuffix(r.URL.Path, "/"), "/generate") || generatesStream(r)
}

// generatesStream reports whether r asks TGI's /generate_stream, which
// streams whatever its body says.
func generatesStream(r *http.Request) bool {
	return strings.HasSuffix(strings.TrimSuffix(r.URL.Path, "/"), "/generate_stream")
}

// asGenerate is f as a native /generate body is read: TGI and SGLang
// read its budget from max_new_tokens and its completions from best_of,
// n and the batch, vLLM's demo api_server from the top-level max_tokens
// and n as its OpenAI-compatible API does; the handler cannot tell
// which runs it, so each is the heavier reading's (cost max_tokens' too).
func asGenerate(f jsonscan.Fields) jsonscan.Fields {
	f.Budget = max(f.Budget, f.NewTokens)
	f.MaxTokens = max(f.MaxTokens, f.NewTokens)
	f.Completions = max(f.Completions, f.NewCompletions)
	return f
}

// newWeight reads a request's text and budget from its body (bodyLen
// bytes, info sniffed), as its API a reads it, defaultBudget when the
// body sets none, and its media at perMedia tokens each; its
// prompt tokens are estimated once its queue is known (estimate).
func newWeight(info jsonscan.Fields, a api, bodyLen int, defaultBudget, perMedia int) weight {
	budget, completions := a.budget(info)
	w := weight{text: info.PromptBytes, media: info.Media, reasoning: info.Reasoning, budget: budget, completions: max(completions, 1)}
	w.mediaTokens = jsonscan.MaxTokenCount
	if per := max(int64(perMedia), 1); w.media <= w.mediaTokens/per {
		w.mediaTokens = w.media * per
	}
	w.ids = info.PromptTokens
	if !info.Prompt {
		// Not a body whose prompt we can read: count all of it (an
		// Ollama "context" included), or its token ids where more
		// (SGLang's "input_ids" on its native /generate: "1," is half
		// a token of bytes).
		w.text, w.noPrompt = int64(bodyLen), true
	}
	if w.budget <= 0 {
		w.budget = int64(defaultBudget)
		w.open = true
	}
	return w
}

// estimate fills in the prompt's tokens: its text at bytesPerToken, its
// token ids (with noPrompt, the text holds them: the more of the two)
// and its media, saturated.
func (w *weight) estimate(bytesPerToken float64) {
	text := int64(math.Ceil(float64(w.text) / bytesPerToken))
	if w.noPrompt {
		text = max(text-w.ids, 0)
	}
	w.prompt = min(text+w.ids+w.mediaTokens, jsonscan.MaxTokenCount)
}

// tokens is the weight: prompt plus budget for each completion,
// saturated.
func (w weight) tokens() int {
	generated := int64(jsonscan.MaxTokenCount)
	if n := max(w.completions, 1); w.budget <= generated/n {
		generated = w.budget * n
	}
	return int(min(w.prompt+min(generated, jsonscan.MaxTokenCount), jsonscan.MaxTokenCount))
}

// promptEstimator learns the bytes of prompt text per prompt token of a
// queue's requests: the ratio of two exponentially weighted moving
// averages (alpha bytesPerTokenAlpha), of the prompt text's bytes and of
// the prompt tokens the backend counted (usage.prompt_tokens, or Ollama's
// prompt_eval_count), over the answers of the requests whose body names
// a prompt. Before the first answer, and as the averages start, the
// ratio is seedBytesPerToken. Long prompts weigh more than short ones, as
// they do in the cache, up to maxSampleShare of the averages each. Each
// engine (queue, on this instance) has its own, kept across reloads.
// Safe for concurrent use.
type promptEstimator struct {
	mu      sync.Mutex
	bytes   float64 // the moving average of the samples' text bytes
	tokens  float64 // the moving average of their prompt tokens
	samples int64   // samples learned
}

// bytesPerToken is the current ratio, within [minBytesPerToken,
// maxBytesPerToken].
func (e *promptEstimator) bytesPerToken() float64 {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.ratio()
}

func (e *promptEstimator) ratio() float64 {
	if e.samples == 0 {
		return seedBytesPerToken
	}
	return min(max(e.bytes/e.tokens, minBytesPerToken), maxBytesPerToken)
}

// state is the ratio and the number of samples learned.
func (e *promptEstimator) state() (bytesPerToken float64, samples int64) {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.ratio(), e.samples
}

// observe learns one answer: text bytes of prompt text counted as
// tokens tokens. A sample whose ratio is out of bounds is left out.
func (e *promptEstimator) observe(text int64, tokens float64) {
	if text <= 0 || !(tokens >= 1) || math.IsInf(tokens, 0) {
		return
	}
	b := float64(text)
	if r := b / tokens; r < minBytesPerToken || r > maxBytesPerToken {
		return
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.samples == 0 {
		// The averages start as if the seed had been seen at this
		// sample's size: the first answer moves the ratio by a tenth.
		e.bytes, e.tokens = seedBytesPerToken*tokens, tokens
	}
	alpha := max(bytesPerTokenAlpha, 1/float64(e.samples+bytesPerTokenStart))
	if most := maxSampleShare / alpha * e.tokens; tokens > most {
		b, tokens = b*most/tokens, most
	}
	e.bytes += alpha * (b - e.bytes)
	e.tokens += alpha * (tokens - e.tokens)
	e.samples++
}
