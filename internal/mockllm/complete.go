package mockllm

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"time"
)

// kind is the flavour of completion endpoint.
type kind int

const (
	chatKind kind = iota
	textKind
)

// completionRequest holds the fields of an OpenAI request the mock reads.
type completionRequest struct {
	Model         string `json:"model"`
	Stream        bool   `json:"stream"`
	StreamOptions struct {
		IncludeUsage bool `json:"include_usage"`
	} `json:"stream_options"`
	// The GPU model reads the text and the answer's length.
	Messages []struct {
		Content json.RawMessage `json:"content"`
	} `json:"messages"`
	Prompt              json.RawMessage `json:"prompt"`
	MaxTokens           *int            `json:"max_tokens"`
	MaxCompletionTokens *int            `json:"max_completion_tokens"`
}

// promptTokens is the prompt's tokens in the GPU model: the bytes of its
// text / 4, rounded up, at least 1. The text is every message's content
// (a string, or the text of its parts) of a chat request, the prompt (a
// string or strings) of a text one; a request with neither counts its
// body's bytes, as the usage of the other answers does.
func (r *completionRequest) promptTokens(body []byte) int {
	n, found := 0, false
	for _, m := range r.Messages {
		n += textBytes(m.Content)
		found = true
	}
	if len(r.Prompt) > 0 {
		n += textBytes(r.Prompt)
		found = true
	}
	if !found {
		n = len(body)
	}
	return max(1, (n+3)/4)
}

// textBytes is the length of a string, or of the strings (or the text
// of the parts) of an array.
func textBytes(raw json.RawMessage) int {
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return len(s)
	}
	var parts []json.RawMessage
	if json.Unmarshal(raw, &parts) != nil {
		return 0
	}
	n := 0
	for _, p := range parts {
		var part struct {
			Text string `json:"text"`
		}
		if json.Unmarshal(p, &s) == nil {
			n += len(s)
		} else if json.Unmarshal(p, &part) == nil {
			n += len(part.Text)
		}
	}
	return n
}

// answerTokens is the answer's length the request asks of the GPU model:
// X-Mock-Tokens (header, tokens) when set, else max_completion_tokens,
// else max_tokens; -1 when none (the model draws one).
func (r *completionRequest) answerTokens(header bool, tokens int) (int, error) {
	switch {
	case header:
		return tokens, nil
	case r.MaxCompletionTokens != nil:
		if *r.MaxCompletionTokens < 1 {
			return 0, fmt.Errorf("max_completion_tokens %d: want >= 1", *r.MaxCompletionTokens)
		}
		return *r.MaxCompletionTokens, nil
	case r.MaxTokens != nil:
		if *r.MaxTokens < 1 {
			return 0, fmt.Errorf("max_tokens %d: want >= 1", *r.MaxTokens)
		}
		return *r.MaxTokens, nil
	}
	return -1, nil
}

// outcome is how a completion ended, for the counters.
type outcome int

const (
	failed outcome = iota
	served
	canceled
)

func (s *Server) complete(w http.ResponseWriter, r *http.Request, k kind) {
	var arrived time.Time
	var body []byte
	var bodyErr error
	read := false // body and bodyErr hold the request's body
	if s.slotted && r.Header.Get(HeaderQueue) != "" {
		// The body first: the server notices a client that leaves only
		// once its request is read.
		body, bodyErr = io.ReadAll(io.LimitReader(r.Body, maxBody))
		if bodyErr != nil {
			writeError(w, http.StatusBadRequest, fmt.Sprintf("reading the body: %v", bodyErr))
			return
		}
		read = true
		var ok bool
		if arrived, ok = s.takeSlot(r.Context(), r.Header.Get(HeaderClientSeq)); !ok {
			return
		}
		defer s.giveSlot() // runs after leave: the end is recorded first
	} else {
		arrived = s.arrive(r.Header.Get(HeaderClientSeq))
	}
	result := failed
	defer func() { s.leave(result, r.Header.Get(HeaderClientSeq), arrived) }()

	if s.refused(w) {
		return
	}
	tokens, delay, err := s.params(r.Header)
	if err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	if !read {
		body, bodyErr = io.ReadAll(io.LimitReader(r.Body, maxBody))
	}
	if bodyErr != nil {
		writeError(w, http.StatusBadRequest, fmt.Sprintf("reading the body: %v", bodyErr))
		return
	}
	var req completionRequest
	if err := json.Unmarshal(body, &req); err != nil {
		writeError(w, http.StatusBadRequest, fmt.Sprintf("invalid JSON body: %v", err))
		return
	}
	if req.Model == "" {
		req.Model = "mock"
	}
	prefix := "cmpl-mock-"
	if k == chatKind {
		prefix = "chatcmpl-mock-"
	}
	a := answer{
		id:      prefix + strconv.FormatUint(s.lastID.Add(1), 10),
		created: time.Now().Unix(),
		model:   req.Model,
		kind:    k,

		promptTokens: (len(body) + 3) / 4,
		includeUsage: req.StreamOptions.IncludeUsage,
	}
	if s.gpu != nil {
		asked, err := req.answerTokens(r.Header.Get(HeaderTokens) != "", tokens)
		if err != nil {
			writeError(w, http.StatusBadRequest, err.Error())
			return
		}
		a.promptTokens = req.promptTokens(body)
		result = s.gpuAnswer(r.Context(), w, a, req.Stream, asked)
		return
	}
	if req.Stream {
		result = s.stream(r.Context(), w, a, tokens, delay)
	} else {
		result = s.whole(r.Context(), w, a, tokens, delay)
	}
}

// params reads the per-request overrides of the Config.
func (s *Server) params(h http.Header) (tokens int, delay time.Duration, err error) {
	tokens, delay = s.tokens, s.delay
	if v := h.Get(HeaderTokens); v != "" {
		tokens, err = strconv.Atoi(v)
		if err != nil || tokens < 0 {
			return 0, 0, fmt.Errorf("invalid %s %q: want an integer >= 0", HeaderTokens, v)
		}
	}
	if v := h.Get(HeaderDelay); v != "" {
		delay, err = time.ParseDuration(v)
		if err != nil || delay < 0 {
			return 0, 0, fmt.Errorf("invalid %s %q: want a duration >= 0", HeaderDelay, v)
		}
	}
	return tokens, delay, nil
}

// startStream sends a streamed answer's 200 header at once, as a real
// model server does before its first token; false: the client is gone.
func startStream(w http.ResponseWriter, contentType string) (*http.ResponseController, bool) {
	rc := http.NewResponseController(w)
	w.Header().Set("Content-Type", contentType)
	w.Header().Set("Cache-Control", "no-cache")
	w.WriteHeader(http.StatusOK)
	return rc, rc.Flush() == nil
}

// stream sends one server-sent event per token, each after delay, then
// [DONE]. It stops when ctx ends (the client went away).
func (s *Server) stream(ctx context.Context, w http.ResponseWriter, a answer, tokens int, delay time.Duration) outcome {
	rc, ok := startStream(w, "text/event-stream")
	if !ok {
		return canceled
	}
	for i := range tokens {
		if !sleep(ctx, delay) {
			return canceled
		}
		chunk, err := json.Marshal(a.chunk(i == tokens-1))
		if err != nil {
			panic(err) // cannot happen: the types are fixed
		}
		if _, err := fmt.Fprintf(w, "data: %s\n\n", chunk); err != nil {
			return canceled
		}
		if err := rc.Flush(); err != nil {
			return canceled
		}
	}
	if a.includeUsage {
		chunk, err := json.Marshal(a.usageChunk(tokens))
		if err != nil {
			panic(err) // cannot happen: the types are fixed
		}
		if _, err := fmt.Fprintf(w, "data: %s\n\n", chunk); err != nil {
			return canceled
		}
	}
	if _, err := w.Write([]byte("data: [DONE]\n\n")); err != nil {
		return canceled
	}
	if err := rc.Flush(); err != nil {
		return canceled
	}
	return served
}

// whole sends the answer as one JSON object after tokens*delay.
func (s *Server) whole(ctx context.Context, w http.ResponseWriter, a answer, tokens int, delay time.Duration) outcome {
	if !sleep(ctx, time.Duration(tokens)*delay) {
		return canceled
	}
	writeJSON(w, http.StatusOK, a.whole(tokens))
	return served
}

func (s *Server) arrive(seq string) time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.arriveLocked(seq)
}

// arriveLocked counts a completion request arrived; s.mu is held.
func (s *Server) arriveLocked(seq string) time.Time {
	now := time.Now()
	if s.tl != nil {
		s.tl.arrive(&s.stats, now)
	}
	s.stats.InFlight++
	s.stats.MaxInFlight = max(s.stats.MaxInFlight, s.stats.InFlight)
	if seq != "" {
		s.stats.Arrivals = append(s.stats.Arrivals, seq)
	}
	return now
}

// leave counts a completion request ended with o; seq is its
// X-Client-Seq, arrived its arrival time.
func (s *Server) leave(o outcome, seq string, arrived time.Time) {
	now := time.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	if seq != "" {
		if s.took == nil {
			s.took = map[string]time.Duration{}
		}
		s.took[seq] = now.Sub(arrived)
	}
	if s.tl != nil {
		s.tl.leave(&s.stats, arrived, now)
	}
	s.stats.InFlight--
	switch o {
	case served:
		s.stats.Served++
	case canceled:
		s.stats.Canceled++
	}
}

// sleep waits d or until ctx ends, and reports whether ctx is still alive.
func sleep(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}
