package caddyfairqueue

import (
	"net/http"
	"strings"
)

// plainEndpoints are the last path segments of the endpoints that answer
// in one piece whatever the body says, "stream" included: embeddings
// and the other pooling endpoints, tokenizing, and the backends' admin
// and status endpoints. From vLLM's API server's routes
// (vllm/entrypoints/openai/api_server.py, v0.9: /pooling, /classify,
// /score and /v1/score, /rerank, /v1/rerank and /v2/rerank, /tokenize,
// /detokenize, /v1/embeddings, /health, /load, /ping, /v1/models,
// /version, /metrics; with VLLM_SERVER_DEV_MODE /server_info,
// /reset_prefix_cache, /sleep, /wake_up, /is_sleeping) and SGLang's
// (sglang/srt/entrypoints/http_server.py: /encode, /classify,
// /v1/rerank, /v1/score, /flush_cache, /abort_request, /start_profile,
// /stop_profile, /get_model_info, /get_server_info, /health,
// /health_generate). Not /invocations (SageMaker's, which passes the
// body to chat or completions) nor /v1/audio/transcriptions, which
// stream.
var plainEndpoints = map[string]bool{
	"embeddings": true, "pooling": true, "classify": true, "score": true, "rerank": true, "encode": true,
	"tokenize": true, "detokenize": true,
	"health": true, "health_generate": true, "load": true, "ping": true, "models": true, "version": true,
	"metrics": true, "server_info": true, "get_server_info": true, "get_model_info": true,
	"reset_prefix_cache": true, "flush_cache": true, "sleep": true, "wake_up": true, "is_sleeping": true,
	"start_profile": true, "stop_profile": true, "abort_request": true,
}

// neverStreams reports whether r, of API a, asks an endpoint that never
// streams, whatever its body says (plainEndpoints, Ollama's /api/embed
// and /api/embeddings), by its path's last segment, so that a prefix
// does not hide it.
func neverStreams(r *http.Request, a api) bool {
	if a.ollama() {
		return a == apiOllamaEmbed
	}
	p := strings.TrimSuffix(r.URL.Path, "/")
	return plainEndpoints[p[strings.LastIndexByte(p, '/')+1:]]
}

// goReadsStream reports whether a backend that reads a body's keys in
// any case (Go's encoding/json: Ollama's /v1 endpoints) may read the
// "stream" of a body sent to r, of API a, so that a body it reads as
// streaming where the exact reading does not, or the other way round,
// is ambiguous (jsonscan.Fields.AmbiguousStream). Not on an endpoint
// that never streams, nor on a native /generate (SGLang's and vLLM's
// demo server's, Python's exact keys; TGI's, which never streams) or
// TGI's /generate_stream (which always does): no Go backend serves
// those.
func goReadsStream(r *http.Request, a api) bool {
	return !neverStreams(r, a) && !generates(r, a)
}

// generatesNone reports whether r, of API a, asks an endpoint that
// generates no tokens: embeddings (OpenAI's /v1/embeddings, Ollama's
// /api/embed and /api/embeddings) and the other endpoints that never
// stream (neverStreams: vLLM's and SGLang's /pooling, /classify,
// /score, /rerank, tokenizing, admin endpoints). Its budget is 0
// whatever the body sets, and its answer, whose usage counts the input
// alone, teaches the learned budget nothing.
func generatesNone(r *http.Request, a api) bool { return neverStreams(r, a) }
