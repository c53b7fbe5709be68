package caddyfairqueue

import (
	"context"
	"encoding/json"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// An OpenAI-compatible body whose "stream" reads one way with Python's
// exact keys (vLLM, SGLang) and another with Go's keys in any case, the
// last spelling winning (Ollama's /v1 endpoints), is refused at once
// with 400 ambiguous_stream, before any queue, as one naming two models
// is: the handler cannot tell whether its answer will stream, which
// decides its keepalive, the shape of its reject, and whether adaptive
// times its first byte as a first token. Before, it was read the Python
// way alone: on Ollama, {"stream":true,"STREAM":false} got the
// keepalive's event-stream header with the plain answer inside it, that
// answer's whole generation timed as a time to first token (lowering an
// adaptive queue's capacity for every client), and
// {"stream":false,"STREAM":true} streamed without keepalive comments.
func TestABodyWhoseStreamReadsTwoWaysIsRefused(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	h := provisionLocal(t, newContext(t), &Handler{Name: "ambiguous-stream", Permits: 1})
	for _, tc := range []struct {
		body     string
		goStream bool // as Ollama's /v1 reads it
	}{
		{`{"model":"m","stream":false,"STREAM":true,"messages":[]}`, true},
		{`{"model":"m","stream":true,"Stream":false,"messages":[]}`, false},
		{`{"model":"m","Stream":true,"messages":[]}`, true},
		{`{"model":"m","STREAM":true,"stream":false,"sTrEaM":true,"messages":[]}`, true},
	} {
		t.Run(tc.body, func(t *testing.T) {
			var goReq struct {
				Stream bool `json:"stream"`
			}
			require.NoError(t, json.Unmarshal([]byte(tc.body), &goReq))
			require.Equal(t, tc.goStream, goReq.Stream, "the test's premise: how a Go backend reads it")
			requireAmbiguousStream(t, h, "/v1/chat/completions", tc.body)
		})
	}
	// Both readings agreeing, it is served, spelled again or not.
	for _, body := range []string{
		`{"model":"m","stream":true,"messages":[]}`,
		`{"model":"m","stream":false,"STREAM":false,"messages":[]}`,
		`{"model":"m","STREAM":true,"stream":true,"messages":[]}`,
	} {
		next := newHolder()
		req := newRequest(context.Background(), body).start(h, next)
		next.waitEntered(t)
		next.release <- struct{}{}
		req.wait(t)
		assert.Equal(t, http.StatusOK, req.w.Code, body)
	}
}

// Ollama's /v1/responses reads "stream" into a *bool, which a null sets
// to nil (not streaming), where its /v1/chat/completions and
// /v1/completions read it into a bool, which a null leaves as it was:
// the handler, which cannot tell which reads a body, refuses one that
// either Go reading streams and the exact one does not, or the other way
// round. Before, "stream":true,"STREAM":null on /v1/responses streamed
// the keepalive's event-stream header while Ollama answered it plain.
func TestAStreamThatANullUnsetsForOllamasResponsesIsRefused(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	h := provisionLocal(t, newContext(t), &Handler{Name: "ambiguous-stream-responses", Permits: 1})
	for _, body := range []string{
		`{"model":"m","input":"hi","stream":true,"STREAM":null}`,
		`{"model":"m","input":"hi","Stream":true,"stream":true,"sTREAM":null}`,
	} {
		t.Run(body, func(t *testing.T) {
			var goReq struct {
				Stream *bool `json:"stream"`
			}
			require.NoError(t, json.Unmarshal([]byte(body), &goReq))
			require.Nil(t, goReq.Stream, "the test's premise: Ollama's /v1/responses does not stream it")
			requireAmbiguousStream(t, h, "/v1/responses", body)
		})
	}
}

// requireAmbiguousStream checks that h answers body, sent to path, with
// 400 ambiguous_stream at once, never reaching the upstream.
func requireAmbiguousStream(t *testing.T, h *Handler, path, body string) {
	t.Helper()
	next := newHolder()
	req := newRequest(context.Background(), body)
	req.r.URL.Path = path
	req.start(h, next)
	select {
	case <-next.entered:
		next.release <- struct{}{}
		req.wait(t)
		t.Fatalf("a body whose stream reads two ways was served (streaming %v)", req.placeholder(phStreaming))
	case <-req.done:
	case <-time.After(10 * time.Second):
		t.Fatal("no answer")
	}
	require.Equal(t, http.StatusBadRequest, req.w.Code, "%s", req.w.Body.String())
	assert.Equal(t, "application/json", req.w.Header().Get("Content-Type"))
	assert.Empty(t, req.w.Header().Get("Fair-Queue-Reason"))
	assert.JSONEq(t, `{"error":{"message":"The request body sets \"stream\" more than once, in different spellings and to different values.",`+
		`"type":"invalid_request_error","code":"ambiguous_stream"}}`, req.w.Body.String())
}
