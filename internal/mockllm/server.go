// Package mockllm is an OpenAI-compatible upstream for tests and demos.
//
// It answers chat and text completions with a fixed number of "tok "
// tokens, one per delay, streamed as server-sent events or returned as one
// JSON object, and it counts what a fair queue in front of it must
// control: how many completions run at once, how many were served, and in
// which order clients arrived. Answers carry an OpenAI usage object
// (prompt_tokens: the request body's bytes / 4, rounded up;
// completion_tokens: the tokens sent): in the JSON answer, and in a
// last streamed chunk (no choices) when the request sets
// "stream_options":{"include_usage":true}, as OpenAI does; the other
// chunks then carry "usage":null. Tests start it in-process with
// httptest.NewServer(mockllm.New(cfg).Handler()); cmd/mockllm runs it
// standalone.
//
// With Config.GPU it models a GPU server instead (gpu.go): requests run
// as one batch whose steps slow down as it grows, prompts cost prefill
// time in proportion to their tokens, every running request holds its
// tokens in a KV cache of fixed size whose overflow preempts the newest,
// and GET /metrics shows it under vLLM's metric names.
package mockllm

import (
	"encoding/json"
	"maps"
	"net/http"
	"sync"
	"sync/atomic"
	"time"
)

// maxBody is the largest request body read.
const maxBody = 64 << 20

// Defaults of Config.
const (
	DefaultTokens = 8
	DefaultDelay  = 20 * time.Millisecond
)

// Request headers that override the Config for one request, and the one
// that names it in Arrivals.
const (
	// HeaderTokens sets the number of tokens of the answer, >= 0.
	HeaderTokens = "X-Mock-Tokens"
	// HeaderDelay sets the delay before each token, a Go duration >= 0
	// ("250ms").
	HeaderDelay = "X-Mock-Delay"
	// HeaderClientSeq is recorded, in arrival order, by Arrivals.
	HeaderClientSeq = "X-Client-Seq"
	// HeaderQueue (any value) makes a completion request wait for one
	// of Config.Slots.
	HeaderQueue = "X-Mock-Queue"
)

// Config configures a Server.
type Config struct {
	// Tokens is the number of tokens in each answer. Zero means
	// DefaultTokens (8); a negative value means none.
	Tokens int
	// Delay is the time before each token, so an answer takes
	// Tokens*Delay. Zero means DefaultDelay (20ms); a negative value means
	// no delay.
	Delay time.Duration
	// Timeline makes Stats report BusyMS and HandoffGapsUS, for
	// benchmarks. Off by default: it keeps timestamps.
	Timeline bool
	// Refuse is the number of first completion requests answered with
	// RefuseStatus instead, as an overloaded model server does (see
	// refuse.go). Default 0: none.
	Refuse int
	// RefuseStatus is the status of a refused request. Default 503.
	RefuseStatus int
	// RetryAfter is the Retry-After header of a refused request ("":
	// none).
	RetryAfter string
	// Slots is the most completions answered at once among the requests
	// that carry HeaderQueue; later ones wait for a slot, in arrival
	// order, as a model server's own queue holds what its batch cannot
	// take, and count as arrived (Stats.Arrivals, InFlight) when they
	// get it. Requests without the header are answered at once, so that
	// a limiter in front is still seen if it lets too many through.
	// Default 0: no slots, the header is ignored.
	Slots int
	// GPU, with KVTokens > 0, answers completions from a model of a GPU
	// server (gpu.go) instead of Tokens x Delay: requests run as one
	// batch whose steps slow down as it grows, hold their tokens in a KV
	// cache of fixed size, are preempted when it is full and wait inside
	// the server beyond MaxNumSeqs; GET /metrics shows it under vLLM's
	// names. Delay and X-Mock-Delay are then ignored; Slots still
	// applies, before the model. Server.Close stops it.
	GPU GPUConfig
}

// Stats is a snapshot of a Server's counters, as served by GET /stats.
type Stats struct {
	// InFlight is the number of completion requests being answered now.
	InFlight int `json:"in_flight"`
	// Waiting is the number of completion requests waiting for one of
	// Config.Slots.
	Waiting int `json:"waiting"`
	// MaxInFlight is the highest InFlight since start or Reset.
	MaxInFlight int `json:"max_in_flight"`
	// Served is the number of completions answered in full.
	Served int `json:"served"`
	// Canceled is the number of completions cut short because the client
	// went away.
	Canceled int `json:"canceled"`
	// Refused is the number of completion requests answered with
	// Config.RefuseStatus.
	Refused int `json:"refused"`
	// Arrivals holds the X-Client-Seq header of each completion request
	// that had one, in the order the requests arrived.
	Arrivals []string `json:"arrivals"`
	// BusyMS is, with Config.Timeline, the summed duration of the
	// completions that ended, in milliseconds: the busy slot-time, whose
	// ratio to (slots x wall time) is the utilization of a limiter's
	// permits.
	BusyMS float64 `json:"busy_ms,omitempty"`
	// HandoffGapsUS holds, with Config.Timeline, one entry per completion
	// request that arrived while an earlier completion's end was not yet
	// followed by an arrival: the time from that end (oldest first) to
	// the arrival, in microseconds. Behind a saturated limiter each is
	// the handoff of a freed slot to the next waiter. At most
	// maxHandoffGaps entries.
	HandoffGapsUS []int64 `json:"handoff_gaps_us,omitempty"`
	// GPU is, with Config.GPU, the GPU model's state, its peaks and its
	// counters since start or Reset.
	GPU *GPUStats `json:"gpu,omitempty"`
}

// Server is a mock LLM upstream. Its methods are safe for concurrent use.
type Server struct {
	tokens int
	delay  time.Duration

	refuse *refusal
	// slotted: Config.Slots > 0; free slots and the requests waiting
	// for one, in arrival order (guarded by mu).
	slotted   bool
	freeSlots int
	slotQueue []*slotWaiter

	lastID atomic.Uint64
	mu     sync.Mutex
	stats  Stats
	tl     *timeline                // nil unless Config.Timeline
	took   map[string]time.Duration // ServiceTimes
	gpu    *gpuRunner               // nil unless Config.GPU
}

// New returns a Server configured by cfg. It panics if cfg.GPU fails
// its Check.
func New(cfg Config) *Server {
	s := &Server{tokens: cfg.Tokens, delay: cfg.Delay, refuse: newRefusal(cfg)}
	if cfg.GPU.KVTokens > 0 {
		if err := cfg.GPU.Check(); err != nil {
			panic("mockllm: " + err.Error())
		}
		s.gpu = startGPU(cfg.GPU)
	}
	if cfg.Timeline {
		s.tl = new(timeline)
	}
	s.slotted, s.freeSlots = cfg.Slots > 0, cfg.Slots
	if s.tokens == 0 {
		s.tokens = DefaultTokens
	}
	s.tokens = max(s.tokens, 0)
	if s.delay == 0 {
		s.delay = DefaultDelay
	}
	s.delay = max(s.delay, 0)
	return s
}

// Handler returns the HTTP API of the server:
//
//	POST /v1/chat/completions  chat completion, streamed if "stream": true
//	POST /v1/completions       text completion, likewise
//	GET  /v1/models            the model list
//	POST /api/chat             Ollama's chat, streamed as NDJSON unless "stream": false (ollama.go)
//	POST /api/generate         Ollama's generate, likewise
//	POST /api/embed            Ollama's embeddings
//	GET  /health               200 ok
//	GET  /stats                Stats as JSON
//	POST /stats/reset          Reset
//	GET  /metrics              with Config.GPU: the model in Prometheus' text format
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	if s.gpu != nil {
		mux.HandleFunc("GET /metrics", s.metrics)
	}
	mux.HandleFunc("POST /v1/chat/completions", func(w http.ResponseWriter, r *http.Request) {
		s.complete(w, r, chatKind)
	})
	mux.HandleFunc("POST /v1/completions", func(w http.ResponseWriter, r *http.Request) {
		s.complete(w, r, textKind)
	})
	mux.HandleFunc("GET /v1/models", s.models)
	mux.HandleFunc("POST /api/chat", func(w http.ResponseWriter, r *http.Request) { s.ollama(w, r, ollamaChat) })
	mux.HandleFunc("POST /api/generate", func(w http.ResponseWriter, r *http.Request) { s.ollama(w, r, ollamaGenerate) })
	mux.HandleFunc("POST /api/embed", s.embed)
	mux.HandleFunc("GET /health", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		_, _ = w.Write([]byte("ok\n"))
	})
	mux.HandleFunc("GET /stats", func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, http.StatusOK, s.Stats())
	})
	mux.HandleFunc("POST /stats/reset", func(w http.ResponseWriter, _ *http.Request) {
		s.Reset()
		writeJSON(w, http.StatusOK, s.Stats())
	})
	return mux
}

// Stats returns a snapshot of the counters.
func (s *Server) Stats() Stats {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.stats
	st.Arrivals = append([]string{}, s.stats.Arrivals...)
	if s.tl != nil {
		st.HandoffGapsUS = append([]int64{}, s.stats.HandoffGapsUS...)
	}
	if s.gpu != nil {
		st.GPU = s.gpu.stats()
	}
	return st
}

// Close stops the GPU model, if any: the requests it was answering end
// cut short. The other answers are the HTTP server's to end.
func (s *Server) Close() {
	if s.gpu != nil {
		s.gpu.close()
	}
}

// InFlight returns the number of completion requests being answered now.
func (s *Server) InFlight() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.stats.InFlight
}

// MaxInFlight returns the highest number of completion requests answered
// at once since start or Reset.
func (s *Server) MaxInFlight() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.stats.MaxInFlight
}

// Served returns the number of completions answered in full since start or
// Reset.
func (s *Server) Served() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.stats.Served
}

// Canceled returns the number of completions cut short by their client
// since start or Reset.
func (s *Server) Canceled() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.stats.Canceled
}

// Arrivals returns the X-Client-Seq header values of the completion
// requests that had one, in arrival order, since start or Reset.
func (s *Server) Arrivals() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string{}, s.stats.Arrivals...)
}

// ServiceTimes returns, per X-Client-Seq header value, how long the
// completion request that carried it stayed at the server, from its
// arrival to its end, for those that ended since start or Reset.
func (s *Server) ServiceTimes() map[string]time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	return maps.Clone(s.took)
}

// Reset zeroes Served, Canceled, Arrivals and ServiceTimes and sets
// MaxInFlight to the current InFlight. InFlight and Waiting are left
// alone: requests still running or waiting will end and decrement them.
func (s *Server) Reset() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.stats = Stats{InFlight: s.stats.InFlight, Waiting: s.stats.Waiting, MaxInFlight: s.stats.InFlight}
	s.took = nil
	if s.tl != nil {
		s.tl.reset()
	}
	if s.gpu != nil {
		s.gpu.reset()
	}
}

func (s *Server) models(w http.ResponseWriter, _ *http.Request) {
	type model struct {
		ID      string `json:"id"`
		Object  string `json:"object"`
		Created int64  `json:"created"`
		OwnedBy string `json:"owned_by"`
	}
	writeJSON(w, http.StatusOK, map[string]any{
		"object": "list",
		"data": []model{
			{ID: "mock", Object: "model", Created: 1700000000, OwnedBy: "mockllm"},
			{ID: "mock-large", Object: "model", Created: 1700000000, OwnedBy: "mockllm"},
		},
	})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	// The client may be gone; there is no one left to tell.
	_ = json.NewEncoder(w).Encode(v)
}

// writeError answers in the shape of an OpenAI API error.
func writeError(w http.ResponseWriter, status int, msg string) {
	writeJSON(w, status, map[string]any{
		"error": map[string]any{"message": msg, "type": "invalid_request_error"},
	})
}
