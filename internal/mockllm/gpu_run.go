package mockllm

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"sync"
	"time"
)

// maxLag is how far the runner's steps may fall behind the wall clock
// and still catch up (the next steps start at once): a timer fires late
// by a little on a busy machine, and steps that always started late
// would make the model slower than configured. Further behind, the
// steps start from now.
const maxLag = 50 * time.Millisecond

// gpuRunner runs the GPU model's steps one after the other, in a
// goroutine of its own that Server.Close stops, and answers the
// requests from them.
type gpuRunner struct {
	mu sync.Mutex
	m  *gpuModel
	// base is m's totals at the last Reset: GPUStats counts from there.
	base     gpuTotals
	wake     chan struct{}
	stop     chan struct{}
	stopOnce sync.Once
	done     chan struct{}
}

// GPUStats is the GPU model in Stats: its state now, its peaks and
// counters since start or Reset.
type GPUStats struct {
	// KVTokens is the cache's size; KVUsed the tokens it holds now,
	// MaxKVUsed the most it held (never above KVTokens).
	KVTokens  int `json:"kv_tokens"`
	KVUsed    int `json:"kv_used"`
	MaxKVUsed int `json:"max_kv_used"`
	// Running and Waiting are the sequences in the batch and in the
	// server's queue; the Max ones their peaks.
	Running    int `json:"running"`
	Waiting    int `json:"waiting"`
	MaxRunning int `json:"max_running"`
	MaxWaiting int `json:"max_waiting"`
	gpuTotals
}

func startGPU(cfg GPUConfig) *gpuRunner {
	g := &gpuRunner{
		m:    newGPUModel(cfg),
		wake: make(chan struct{}, 1),
		stop: make(chan struct{}),
		done: make(chan struct{}),
	}
	go g.loop()
	return g
}

// loop runs steps while something waits or runs; it sleeps until an
// arrival otherwise.
func (g *gpuRunner) loop() {
	defer close(g.done)
	var next time.Time // when the step being run ends
	t := time.NewTimer(time.Hour)
	defer t.Stop()
	for {
		g.mu.Lock()
		d, ok := g.m.begin()
		g.mu.Unlock()
		if !ok {
			select {
			case <-g.wake:
				next = time.Time{}
				continue
			case <-g.stop:
				return
			}
		}
		now := time.Now()
		if next.IsZero() || now.Sub(next) > maxLag {
			next = now
		}
		next = next.Add(d)
		t.Reset(max(0, time.Until(next)))
		select {
		case <-t.C:
		case <-g.stop:
			return
		}
		g.mu.Lock()
		g.m.finish(time.Now())
		g.mu.Unlock()
	}
}

// close stops the loop and ends every request still in the model; a
// second call does nothing more.
func (g *gpuRunner) close() {
	g.stopOnce.Do(func() { close(g.stop) })
	<-g.done
	g.mu.Lock()
	defer g.mu.Unlock()
	for _, s := range append(g.m.waiting, g.m.running...) {
		s.aborted, s.done = true, true
		s.signal()
	}
	g.m.waiting, g.m.running = nil, nil
}

// add queues a request; asked is the answer's tokens, or -1 for a draw.
func (g *gpuRunner) add(prompt, asked int) (*seq, error) {
	g.mu.Lock()
	s, err := g.m.add(prompt, g.m.answerLength(prompt, asked), time.Now())
	g.mu.Unlock()
	if err == nil {
		select {
		case g.wake <- struct{}{}:
		default:
		}
	}
	return s, err
}

// progress returns the tokens s made so far and whether it is done.
func (g *gpuRunner) progress(s *seq) (made int, done bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	return s.made, s.done
}

func (g *gpuRunner) abort(s *seq) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.m.abort(s)
}

func (g *gpuRunner) stats() *GPUStats {
	g.mu.Lock()
	defer g.mu.Unlock()
	m := g.m
	st := &GPUStats{
		KVTokens: m.cfg.KVTokens, KVUsed: m.used, MaxKVUsed: m.maxUsed,
		Running: len(m.running), Waiting: len(m.waiting), MaxRunning: m.maxRunning, MaxWaiting: m.maxWaiting,
		gpuTotals: m.totals,
	}
	b := g.base
	st.Preemptions -= b.Preemptions
	st.PromptTokens -= b.PromptTokens
	st.ComputedTokens -= b.ComputedTokens
	st.GenerationTokens -= b.GenerationTokens
	st.Finished -= b.Finished
	st.Aborted -= b.Aborted
	st.Steps -= b.Steps
	st.BusyNS -= b.BusyNS
	return st
}

func (g *gpuRunner) reset() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.base = g.m.totals
	g.m.resetPeaks()
}

func (g *gpuRunner) metrics() gpuMetrics {
	g.mu.Lock()
	defer g.mu.Unlock()
	m := g.m
	return gpuMetrics{
		model: "mock", running: len(m.running), waiting: len(m.waiting), used: m.used, kvTokens: m.cfg.KVTokens,
		totals: m.totals, ttftCounts: append([]int64{}, m.ttft.counts...), ttftBounds: m.ttft.bounds,
		ttftSum: m.ttft.sum, ttftCount: m.ttft.count,
		maxNumSeqs: m.cfg.MaxNumSeqs, batchedTokens: m.cfg.MaxBatchedTokens,
	}
}

// gpuAnswer answers a completion from the GPU model: its tokens as the
// steps make them, streamed or whole, and its usage always (as vLLM's
// --enable-force-include-usage).
func (s *Server) gpuAnswer(ctx context.Context, w http.ResponseWriter, a answer, stream bool, asked int) outcome {
	sq, err := s.gpu.add(a.promptTokens, asked)
	if err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return failed
	}
	defer s.gpu.abort(sq) // a no-op once done
	a.includeUsage = true
	if !stream {
		for {
			select {
			case <-sq.ready:
			case <-ctx.Done():
				return canceled
			}
			if made, done := s.gpu.progress(sq); done {
				if made < sq.want {
					return canceled // the server closed
				}
				writeJSON(w, http.StatusOK, a.whole(made))
				return served
			}
		}
	}
	rc, ok := startStream(w, "text/event-stream")
	if !ok {
		return canceled
	}
	sent := 0
	for {
		select {
		case <-sq.ready:
		case <-ctx.Done():
			return canceled
		}
		made, done := s.gpu.progress(sq)
		for ; sent < made; sent++ {
			if err := writeEvent(w, a.chunk(sent == sq.want-1)); err != nil {
				return canceled
			}
		}
		if done {
			if made < sq.want {
				return canceled // the server closed
			}
			if err := writeEvent(w, a.usageChunk(made)); err != nil {
				return canceled
			}
			if _, err := w.Write([]byte("data: [DONE]\n\n")); err != nil {
				return canceled
			}
		}
		if err := rc.Flush(); err != nil {
			return canceled
		}
		if done {
			return served
		}
	}
}

// writeEvent writes v as one server-sent event.
func writeEvent(w http.ResponseWriter, v any) error {
	data, err := json.Marshal(v)
	if err != nil {
		panic(err) // cannot happen: the types are fixed
	}
	_, err = fmt.Fprintf(w, "data: %s\n\n", data)
	return err
}
