package caddyfairqueue

import (
	"bytes"
	"encoding/json"
	"net/http"
	"strings"
	"time"

	"github.com/fair-queue/caddy-fair-queue/internal/jsonscan"
)

// api is the API a request speaks, read from its path: what the handler
// writes itself (errors, waiting feedback, a committed stream's end)
// takes that API's shape, so that its client libraries read it.
//
// OpenAI-compatible paths (/v1/chat/completions, /v1/completions,
// /v1/responses, and any other path but those that never stream, such
// as /v1/embeddings: neverStreams) stream when the body says
// "stream": true or the client accepts text/event-stream;
// errors are {"error":{"message","type","code"}}; streams are server-sent
// events. Ollama's native API (/api/chat, /api/generate, /api/embed,
// /api/embeddings) streams unless the body says "stream": false;
// errors are {"error":"<message>"}; streams are NDJSON, one JSON object
// per line, and an error in a stream is such a line.
type api uint8

const (
	apiOpenAI api = iota
	apiOllamaChat
	apiOllamaGenerate
	apiOllamaEmbed
)

// apiOf reads the API of r from its path's last two segments, so that a
// prefix (handle_path, a mount point) does not hide it.
func apiOf(r *http.Request) api {
	p := strings.TrimSuffix(r.URL.Path, "/")
	switch {
	case strings.HasSuffix(p, "/api/chat"):
		return apiOllamaChat
	case strings.HasSuffix(p, "/api/generate"):
		return apiOllamaGenerate
	case strings.HasSuffix(p, "/api/embed"), strings.HasSuffix(p, "/api/embeddings"):
		return apiOllamaEmbed
	}
	return apiOpenAI
}

// ollama reports whether a is one of Ollama's native endpoints.
func (a api) ollama() bool { return a != apiOpenAI }

// modelName is the model a request of a names, as its backend reads it:
// on Ollama's native API, ollamaModel; on an OpenAI-compatible path, as
// sent.
func (a api) modelName(model string) string {
	if a.ollama() {
		return ollamaModel(model)
	}
	return model
}

// ollamaModel is model as Ollama reads it: a name without a tag
// ("llama3", "team/llama3") is its "latest" tag ("llama3:latest"), the
// name `ollama list` shows. The tag follows the last colon after the
// last slash (a registry's port comes before it); a name pinned by
// digest ("llama3@sha256:...") and an empty one are kept as they are.
func ollamaModel(model string) string {
	if model == "" || strings.ContainsAny(model[strings.LastIndexByte(model, '/')+1:], ":@") {
		return model
	}
	return model + ":latest"
}

// ollamaUntagged is model, as ollamaModel names it, without its
// ":latest" ("llama3:latest": "llama3"), the other spelling Ollama reads
// as the same model; ok false where there is none (another tag, a
// digest, no name).
func ollamaUntagged(model string) (untagged string, ok bool) {
	untagged, ok = strings.CutSuffix(ollamaModel(model), ":latest")
	if !ok || untagged == "" || strings.ContainsAny(untagged[strings.LastIndexByte(untagged, '/')+1:], ":@") {
		return "", false
	}
	return untagged, true
}

// sniff reads the fields of a request body of a as its backend reads
// them: Ollama's native API with Go's encoding/json, whose keys match
// case-insensitively; an OpenAI-compatible one both as vLLM and SGLang
// (pydantic: exact keys) and as Ollama's /v1 endpoints (Go) read it, the
// heavier reading's counts (jsonscan.SniffEither).
func (a api) sniff(body []byte) jsonscan.Fields {
	if a.ollama() {
		f := jsonscan.SniffFolded(body)
		f.MaxTokens = f.NumPredict // cost max_tokens: the only budget Ollama reads
		f.Completions = 0          // and it generates one completion
		return f
	}
	return jsonscan.SniffEither(body)
}

// budget is the completion budget that a request of a with body fields
// f sets, and the completions it asks for (0: one), as its API reads
// them: Ollama's native API reads "options": {"num_predict"} alone and
// generates one completion; an OpenAI-compatible one reads
// "max_tokens" and the like, and "n", and ignores "options".
func (a api) budget(f jsonscan.Fields) (budget, completions int64) {
	if a.ollama() {
		return f.NumPredict, 0
	}
	return f.Budget, f.Completions
}

// streams reports whether a request of a with body fields f (and header
// of r) wants its answer streamed: never on an endpoint that never
// streams (neverStreams), whose plain answer a committed event stream
// would wrap.
func (a api) streams(f jsonscan.Fields, r *http.Request) bool {
	switch a {
	case apiOllamaChat, apiOllamaGenerate:
		return !f.NoStream
	case apiOllamaEmbed:
		return false
	}
	return (f.Stream || wantsEventStream(r)) && !neverStreams(r, a)
}

// errorBody is an error answer's body: OpenAI's error object with its
// type and code, or Ollama's {"error": message}.
func (a api) errorBody(message, typ, code string) []byte {
	if a.ollama() {
		return ollamaError(message)
	}
	return marshalError(message, typ, code)
}

// ollamaError is Ollama's error object.
func ollamaError(message string) []byte {
	return encodeJSON(struct {
		Error string `json:"error"`
	}{message})
}

// streamHeader sets the header of a stream the handler commits itself
// (sse_keepalive): an event stream, or Ollama's NDJSON.
func (a api) streamHeader(h http.Header) {
	if a.ollama() {
		h.Set("Content-Type", "application/x-ndjson")
	} else {
		h.Set("Content-Type", "text/event-stream")
	}
	h.Set("Cache-Control", "no-cache")
	h.Set("X-Accel-Buffering", "no") // nginx: do not buffer the stream
	h.Del("Content-Length")
}

// errorFrame frames an error in a committed stream: an SSE error event
// whose data is body, or body as one NDJSON line (Ollama's clients
// throw on a line with an "error" member).
func (a api) errorFrame(body []byte) []byte {
	if a.ollama() {
		return append(bytes.Clone(body), '\n')
	}
	return sseEvent("error", string(body))
}

// waiting is the feedback one keepalive tick sends a waiting streaming
// client: an SSE comment (and the queue event when events is set), or,
// for Ollama, an empty chunk of the answer, which its clients pass on
// as no text (an NDJSON stream has no comments).
func (a api) waiting(st waitStatus, events bool, model string) []byte {
	switch a {
	case apiOllamaChat:
		return ollamaChunk(model, `"message":{"role":"assistant","content":""}`)
	case apiOllamaGenerate:
		return ollamaChunk(model, `"response":""`)
	}
	b := st.comment()
	if events {
		b = append(b, st.event()...)
	}
	return b
}

// ollamaChunk is a streamed Ollama answer's chunk that is not the last.
func ollamaChunk(model, content string) []byte {
	m, _ := json.Marshal(model)
	return []byte(`{"model":` + string(m) + `,"created_at":"` + time.Now().UTC().Format(time.RFC3339Nano) +
		`",` + content + `,"done":false}` + "\n")
}

// upstreamErrorBody is the body of the error frame for an upstream's
// error answer on a committed stream: its body when that is a JSON error
// of the request's API (on one line), else the default error object.
func (a api) upstreamErrorBody(status int, body []byte) []byte {
	if !a.ollama() {
		return upstreamError(status, body)
	}
	var v struct {
		Error *string `json:"error"`
	}
	if body = bytes.TrimSpace(body); len(body) <= maxUpstreamErrorBody && json.Unmarshal(body, &v) == nil && v.Error != nil {
		return ollamaError(*v.Error)
	}
	return ollamaError(upstreamStatusMessage(status))
}
