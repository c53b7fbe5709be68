package mockllm

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"
)

// Ollama's native API, as Ollama serves it: POST /api/chat and
// /api/generate answer with Tokens "tok " tokens, one per Delay, streamed
// as NDJSON (Content-Type application/x-ndjson, one JSON object per line,
// the last with "done": true and the counts prompt_eval_count and
// eval_count) unless the body says "stream": false, which gets one JSON
// object; POST /api/embed answers at once with one embedding per input.
// Errors are {"error": "<message>"}. They count in Stats as completions
// do; Config.Slots and Config.Refuse apply to the OpenAI paths only.

// ollamaKind is an Ollama endpoint that generates text.
type ollamaKind int

const (
	ollamaChat ollamaKind = iota
	ollamaGenerate
)

// ollamaRequest is the part of an Ollama request body the mock reads.
type ollamaRequest struct {
	Model  string `json:"model"`
	Stream *bool  `json:"stream"`
}

func (s *Server) ollama(w http.ResponseWriter, r *http.Request, k ollamaKind) {
	arrived := s.arrive(r.Header.Get(HeaderClientSeq))
	result := failed
	defer func() { s.leave(result, r.Header.Get(HeaderClientSeq), arrived) }()
	tokens, delay, err := s.params(r.Header)
	if err != nil {
		writeOllamaError(w, http.StatusBadRequest, err.Error())
		return
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, maxBody))
	if err != nil {
		writeOllamaError(w, http.StatusBadRequest, fmt.Sprintf("reading the body: %v", err))
		return
	}
	var req ollamaRequest
	if err := json.Unmarshal(body, &req); err != nil {
		writeOllamaError(w, http.StatusBadRequest, fmt.Sprintf("invalid JSON body: %v", err))
		return
	}
	if req.Model == "" {
		writeOllamaError(w, http.StatusBadRequest, "model is required")
		return
	}
	a := ollamaAnswer{kind: k, model: req.Model, promptTokens: (len(body) + 3) / 4, start: time.Now()}
	if req.Stream != nil && !*req.Stream {
		if !sleep(r.Context(), time.Duration(tokens)*delay) {
			result = canceled
			return
		}
		writeJSON(w, http.StatusOK, a.chunk(strings.Repeat("tok ", tokens), true, tokens))
		result = served
		return
	}
	result = a.stream(r.Context(), w, tokens, delay)
}

// ollamaAnswer is one Ollama answer being made.
type ollamaAnswer struct {
	kind         ollamaKind
	model        string
	promptTokens int
	start        time.Time
}

// chunk is one object of the answer: a token, or the last one (done)
// with the counts.
func (a ollamaAnswer) chunk(text string, done bool, tokens int) map[string]any {
	c := map[string]any{"model": a.model, "created_at": time.Now().UTC().Format(time.RFC3339Nano), "done": done}
	if a.kind == ollamaChat {
		c["message"] = map[string]any{"role": "assistant", "content": text}
	} else {
		c["response"] = text
	}
	if done {
		c["done_reason"] = "stop"
		c["total_duration"] = time.Since(a.start).Nanoseconds()
		c["prompt_eval_count"] = a.promptTokens
		c["eval_count"] = tokens
	}
	return c
}

// stream sends one NDJSON line per token, each after delay, then the
// last line. It stops when ctx ends (the client went away).
func (a ollamaAnswer) stream(ctx context.Context, w http.ResponseWriter, tokens int, delay time.Duration) outcome {
	rc, ok := startStream(w, "application/x-ndjson")
	if !ok {
		return canceled
	}
	enc := json.NewEncoder(w)
	for i := range tokens + 1 {
		if i < tokens && !sleep(ctx, delay) {
			return canceled
		}
		c := a.chunk("tok ", false, 0)
		if i == tokens {
			c = a.chunk("", true, tokens)
		}
		if enc.Encode(c) != nil || rc.Flush() != nil {
			return canceled
		}
	}
	return served
}

// embed answers POST /api/embed with one small embedding per input.
func (s *Server) embed(w http.ResponseWriter, r *http.Request) {
	arrived := s.arrive(r.Header.Get(HeaderClientSeq))
	result := failed
	defer func() { s.leave(result, r.Header.Get(HeaderClientSeq), arrived) }()
	var req struct {
		Model string          `json:"model"`
		Input json.RawMessage `json:"input"`
	}
	if err := json.NewDecoder(io.LimitReader(r.Body, maxBody)).Decode(&req); err != nil || req.Model == "" {
		writeOllamaError(w, http.StatusBadRequest, "a model and an input are required")
		return
	}
	n := 1
	var many []string
	if json.Unmarshal(req.Input, &many) == nil {
		n = len(many)
	}
	embeddings := make([][]float64, n)
	for i := range embeddings {
		embeddings[i] = []float64{0.1, 0.2, 0.3}
	}
	writeJSON(w, http.StatusOK, map[string]any{"model": req.Model, "embeddings": embeddings, "prompt_eval_count": 1})
	result = served
}

// writeOllamaError answers in the shape of an Ollama API error.
func writeOllamaError(w http.ResponseWriter, status int, msg string) {
	writeJSON(w, status, map[string]any{"error": msg})
}
