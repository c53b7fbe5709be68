package mockllm

// The GPU model: a model server that runs its requests as one batch, the
// way vLLM's scheduler does, so that how many requests run at once
// changes how fast each one goes. Config.GPU turns it on.
//
// The model is a pure state machine, stepped by begin and finish with
// the time given to them (gpuRunner drives it with the wall clock; the
// tests with their own): begin decides what the next step computes and
// how long it takes, finish hands out the tokens the step made.
//
// A sequence holds in the KV cache every token computed for it: its
// prompt, then each token it generated. A step schedules, for each
// running sequence in admission order, the tokens it has not computed
// yet (at most MaxBatchedTokens in all, a long prompt in chunks): a
// sequence that has computed every token it knows makes one new token at
// the end of the step. When the cache cannot hold a sequence's tokens of
// the step, the newest running sequence is preempted: its tokens are
// freed, it goes back to the head of the waiting queue and recomputes
// its prompt and the tokens it already made when it runs again (vLLM's
// recompute preemption). Waiting sequences are admitted in arrival order
// while fewer than MaxNumSeqs run, the budget lasts, the cache holds
// their first chunk and no sequence was preempted in this step.

import (
	"cmp"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"time"
)

// Defaults of GPUConfig.
const (
	DefaultMaxNumSeqs       = 256
	DefaultMaxBatchedTokens = 8192
	DefaultStepBase         = 8 * time.Millisecond
	DefaultStepPerSeq       = 100 * time.Microsecond
	DefaultPrefillPerToken  = 50 * time.Microsecond
	DefaultAnswerMedian     = 128
	DefaultAnswerSigma      = 0.8
	DefaultMaxAnswer        = 4096
)

// GPUConfig shapes the GPU model (see gpu.go). A request's prompt tokens
// are its text's bytes / 4, rounded up (promptTokens); its answer's
// tokens are X-Mock-Tokens, else max_completion_tokens, else max_tokens,
// else a draw from a log-normal seeded by Seed, at most the cache less
// the prompt.
type GPUConfig struct {
	// KVTokens is the size of the KV cache in tokens. Zero: no GPU model
	// (answers take Config.Delay per token, whatever else runs). A prompt
	// of KVTokens tokens or more is refused with 400, as vLLM refuses one
	// longer than its context.
	KVTokens int
	// MaxNumSeqs is the most sequences running at once (vLLM's
	// --max-num-seqs); the others wait inside the server. Default 256.
	MaxNumSeqs int
	// MaxBatchedTokens is the most tokens one step computes (vLLM's
	// --max-num-batched-tokens): a longer prompt is computed in chunks
	// over several steps. Default 8192.
	MaxBatchedTokens int
	// A step lasts StepBase + StepPerSeq x the sequences in it +
	// PrefillPerToken x the tokens it computes beyond one per sequence
	// (a decode step computes one token per sequence; a prompt, or a
	// preempted sequence's recomputation, many). Defaults 8ms, 100us
	// and 50us.
	StepBase        time.Duration
	StepPerSeq      time.Duration
	PrefillPerToken time.Duration
	// AnswerMedian and AnswerSigma are the log-normal of the answer
	// lengths drawn for requests that name none (median in tokens, sigma
	// of its log); MaxAnswer caps the draw. Defaults 128, 0.8 and 4096.
	AnswerMedian int
	AnswerSigma  float64
	MaxAnswer    int
	// Seed seeds the answer lengths drawn, in arrival order.
	Seed uint64
}

// withDefaults fills the zero fields of c.
func (c GPUConfig) withDefaults() GPUConfig {
	c.MaxNumSeqs = cmp.Or(c.MaxNumSeqs, DefaultMaxNumSeqs)
	c.MaxBatchedTokens = cmp.Or(c.MaxBatchedTokens, DefaultMaxBatchedTokens)
	c.StepBase = cmp.Or(c.StepBase, DefaultStepBase)
	c.StepPerSeq = cmp.Or(c.StepPerSeq, DefaultStepPerSeq)
	c.PrefillPerToken = cmp.Or(c.PrefillPerToken, DefaultPrefillPerToken)
	c.AnswerMedian = cmp.Or(c.AnswerMedian, DefaultAnswerMedian)
	c.AnswerSigma = cmp.Or(c.AnswerSigma, DefaultAnswerSigma)
	c.MaxAnswer = cmp.Or(c.MaxAnswer, DefaultMaxAnswer)
	return c
}

// Check reports a setting the model cannot run with (the defaults
// filled in).
func (c GPUConfig) Check() error {
	c = c.withDefaults()
	switch {
	case c.KVTokens < 0:
		return fmt.Errorf("kv tokens %d: want >= 0", c.KVTokens)
	case c.MaxNumSeqs < 1, c.MaxBatchedTokens < 1, c.AnswerMedian < 1, c.MaxAnswer < 1:
		return fmt.Errorf("max_num_seqs, max_batched_tokens, answer median and max answer must be >= 1")
	case c.StepBase < 0, c.StepPerSeq < 0, c.PrefillPerToken < 0, c.AnswerSigma < 0:
		return fmt.Errorf("step times and the answer sigma must be >= 0")
	}
	return nil
}

// seq is one request in the model.
type seq struct {
	prompt int // prompt tokens
	want   int // answer tokens to make
	// made is the tokens made so far, computed those held in the KV
	// cache; scheduled those the step in progress computes.
	made, computed, scheduled int
	arrived                   time.Time
	// ttft is the time from arrival to the first token; zero before.
	ttft time.Duration
	// preempted counts the times the sequence lost its tokens.
	preempted int
	// done: every token made, or aborted; the model forgot it.
	done, aborted bool
	// ready receives a value (dropped when one is pending) when made
	// grows or the sequence is done.
	ready chan struct{}
}

// known is the tokens the sequence must have computed to make its next.
func (s *seq) known() int { return s.prompt + s.made }

func (s *seq) signal() {
	select {
	case s.ready <- struct{}{}:
	default:
	}
}

// gpuTotals are the model's counters since start.
type gpuTotals struct {
	Preemptions  int64 `json:"preemptions"`
	PromptTokens int64 `json:"prompt_tokens"`
	// ComputedTokens counts every token a step computed, recomputations
	// of preempted sequences included; PromptTokens only first ones.
	ComputedTokens   int64 `json:"computed_tokens"`
	GenerationTokens int64 `json:"generation_tokens"`
	Finished         int64 `json:"finished"`
	Aborted          int64 `json:"aborted"`
	Steps            int64 `json:"steps"`
	// BusyNS is the summed duration of the steps.
	BusyNS int64 `json:"busy_ns"`
}

// gpuModel is the state of the GPU model. It is not safe for concurrent
// use: gpuRunner guards it.
type gpuModel struct {
	cfg     GPUConfig
	draw    *rand.Rand
	waiting []*seq // arrival order; preempted sequences at the head
	running []*seq // admission order: the newest last
	used    int    // KV tokens held
	// stepping: begin ran and finish has not.
	stepping bool
	totals   gpuTotals
	ttft     *histogram
	// peaks since the last resetPeaks.
	maxUsed, maxRunning, maxWaiting int
}

func newGPUModel(cfg GPUConfig) *gpuModel {
	cfg = cfg.withDefaults()
	return &gpuModel{
		cfg:  cfg,
		draw: rand.New(rand.NewPCG(cfg.Seed, 0x6770756d6f64656c)),
		ttft: newHistogram(ttftBuckets),
	}
}

// answerLength returns the tokens of an answer: asked (>= 0) when it is,
// else a draw; at most the cache less the prompt, at least 1.
func (m *gpuModel) answerLength(prompt, asked int) int {
	n := asked
	if n < 0 {
		n = int(math.Round(float64(m.cfg.AnswerMedian) * math.Exp(m.cfg.AnswerSigma*m.draw.NormFloat64())))
		n = min(n, m.cfg.MaxAnswer)
	}
	return max(1, min(n, m.cfg.KVTokens-prompt))
}

// add queues a request of prompt tokens that makes want tokens.
func (m *gpuModel) add(prompt, want int, now time.Time) (*seq, error) {
	if prompt >= m.cfg.KVTokens {
		return nil, fmt.Errorf("the prompt's %d tokens do not fit the KV cache of %d tokens", prompt, m.cfg.KVTokens)
	}
	s := &seq{prompt: prompt, want: want, arrived: now, ready: make(chan struct{}, 1)}
	m.waiting = append(m.waiting, s)
	m.totals.PromptTokens += int64(prompt)
	m.maxWaiting = max(m.maxWaiting, len(m.waiting))
	return s, nil
}

// abort forgets s, whose client left: a waiting one at once, a running
// one at the end of the step in progress (its tokens of the step are
// being computed).
func (m *gpuModel) abort(s *seq) {
	if s.done {
		return
	}
	s.aborted = true
	if i := slices.Index(m.waiting, s); i >= 0 {
		m.waiting = slices.Delete(m.waiting, i, i+1)
		s.done = true
		m.totals.Aborted++
		return
	}
	if !m.stepping {
		m.drop(s)
	}
}

// drop removes the running s, aborted, and frees its tokens.
func (m *gpuModel) drop(s *seq) {
	if i := slices.Index(m.running, s); i >= 0 {
		m.running = slices.Delete(m.running, i, i+1)
	}
	m.used -= s.computed + s.scheduled
	s.computed, s.scheduled, s.done = 0, 0, true
	m.totals.Aborted++
}

// preempt frees the tokens of the newest running sequence and puts it
// back at the head of the waiting queue.
func (m *gpuModel) preempt() *seq {
	s := m.running[len(m.running)-1]
	m.running = m.running[:len(m.running)-1]
	m.used -= s.computed + s.scheduled
	s.computed, s.scheduled = 0, 0
	s.preempted++
	m.totals.Preemptions++
	m.waiting = slices.Insert(m.waiting, 0, s)
	m.maxWaiting = max(m.maxWaiting, len(m.waiting))
	return s
}

// begin schedules the next step and returns how long it lasts; false
// when nothing runs (then finish must not be called). The tokens a step
// computes are held in the cache from its begin.
func (m *gpuModel) begin() (time.Duration, bool) {
	budget := m.cfg.MaxBatchedTokens
	seqs := 0
	preempted := false
	for i := 0; i < len(m.running); i++ {
		s := m.running[i]
		n := min(s.known()-s.computed, budget)
		for m.used+n > m.cfg.KVTokens {
			preempted = true
			if m.preempt() == s {
				n = -1
				break
			}
		}
		if n < 0 {
			break // s itself was the newest: nothing after it runs
		}
		s.scheduled = n
		m.used += n
		budget -= n
		seqs++
		if budget == 0 {
			break
		}
	}
	for !preempted && budget > 0 && len(m.waiting) > 0 && len(m.running) < m.cfg.MaxNumSeqs {
		s := m.waiting[0]
		n := min(s.known(), budget)
		if m.used+n > m.cfg.KVTokens {
			break // the head waits for room; no one overtakes it
		}
		m.waiting = m.waiting[1:]
		m.running = append(m.running, s)
		s.scheduled = n
		m.used += n
		budget -= n
		seqs++
	}
	if seqs == 0 {
		return 0, false
	}
	m.stepping = true
	m.totals.Steps++
	m.maxUsed = max(m.maxUsed, m.used)
	m.maxRunning = max(m.maxRunning, len(m.running))
	computed := m.cfg.MaxBatchedTokens - budget
	m.totals.ComputedTokens += int64(computed)
	d := m.cfg.StepBase + time.Duration(seqs)*m.cfg.StepPerSeq + time.Duration(computed-seqs)*m.cfg.PrefillPerToken
	m.totals.BusyNS += int64(d)
	return d, true
}

// finish ends the step begun: each sequence that has computed every token
// it knows makes one; one that made its last, or was aborted, leaves and
// frees its tokens.
func (m *gpuModel) finish(now time.Time) {
	m.stepping = false
	kept := m.running[:0]
	for _, s := range m.running {
		s.computed += s.scheduled
		s.scheduled = 0
		switch {
		case s.aborted:
			m.used -= s.computed
			s.computed, s.done = 0, true
			m.totals.Aborted++
			continue
		case s.computed < s.known():
			kept = append(kept, s) // a chunk of its prompt, or not scheduled
			continue
		}
		s.made++
		m.totals.GenerationTokens++
		if s.made == 1 {
			s.ttft = now.Sub(s.arrived)
			m.ttft.observe(s.ttft.Seconds())
		}
		if s.made >= s.want {
			m.used -= s.computed
			s.computed, s.done = 0, true
			m.totals.Finished++
			s.signal()
			continue
		}
		s.signal()
		kept = append(kept, s)
	}
	clear(m.running[len(kept):])
	m.running = kept
}

// idle reports whether nothing waits or runs.
func (m *gpuModel) idle() bool { return len(m.running) == 0 && len(m.waiting) == 0 }

// resetPeaks makes the peaks the current values.
func (m *gpuModel) resetPeaks() {
	m.maxUsed, m.maxRunning, m.maxWaiting = m.used, len(m.running), len(m.waiting)
}
