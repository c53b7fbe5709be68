package caddyfairqueue

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// goModel is the model Go's encoding/json reads from body, as a backend
// written in Go (Ollama's OpenAI-compatible /v1 endpoints) does.
func goModel(t *testing.T, body string) string {
	t.Helper()
	var req struct {
		Model string `json:"model"`
	}
	require.NoError(t, json.Unmarshal([]byte(body), &req))
	return req.Model
}

// An OpenAI-compatible body is read by backends of two kinds: Python's
// (vLLM, SGLang: exact keys) and Go's (Ollama's /v1 endpoints: keys in
// any case, the last spelling winning). A body whose two readings name
// different models is refused at once with 400, before any queue: read
// one way it waited in one model's queue (say an idle small model's,
// listed in names) while a Go backend ran the other, escaping that
// model's permits.
func TestABodyThatNamesTwoModelsIsRefused(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	h := provisionLocal(t, newContext(t), &Handler{Name: "{http.fair_queue.model}", Names: []string{"small", "big"}, Permits: 1})
	for _, body := range []string{
		`{"model":"small","MODEL":"big","messages":[]}`,
		`{"model":"small","Model":"big","messages":[]}`,
		`{"MODEL":"big","model":"small","mOdEl":"big","messages":[]}`,
	} {
		t.Run(body, func(t *testing.T) {
			require.Equal(t, "big", goModel(t, body), "the test's premise: a Go backend runs big")
			next := newHolder()
			req := newRequest(context.Background(), body).start(h, next)
			select {
			case <-next.entered:
				next.release <- struct{}{}
				req.wait(t)
				t.Fatalf("a body a Go backend runs as big was served from queue %q", req.placeholder(phQueue))
			case <-req.done:
			case <-time.After(10 * time.Second):
				t.Fatal("no answer")
			}
			assert.Equal(t, http.StatusBadRequest, req.w.Code, "%s", req.w.Body.String())
		})
	}
	// Named once, it is served.
	next := newHolder()
	req := newRequest(context.Background(), `{"model":"big","messages":[]}`).start(h, next)
	next.waitEntered(t)
	next.release <- struct{}{}
	req.wait(t)
	assert.Equal(t, http.StatusOK, req.w.Code)
}

// The weight of an OpenAI-compatible body is the heavier of its two
// readings (Python's exact keys, Go's keys in any case, a repeated
// array decoded into the one before): whichever backend runs it, a
// client gains no room by spelling a key twice.
func TestAnOpenAIBodyIsWeighedAsAGoBackendReadsItToo(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	h := provisionLocal(t, newContext(t), &Handler{Name: "kv-go-json", KVTokens: 100000, DefaultMaxTokens: 500})
	long := strings.Repeat("s", 4000)
	for _, tc := range []struct {
		name, body string
		want       int64
	}{
		{"max_tokens spelled again", `{"model":"m","max_tokens":1,"MAX_TOKENS":1000,"messages":[{"role":"user","content":"abcd"}]}`, 1 + 1000},
		{"messages spelled again", `{"model":"m","max_tokens":10,"messages":[{"role":"user","content":"abcd"}],"Messages":[{"role":"user","content":"` + long + `"}]}`, 1000 + 10},
		{"messages sent again without content", `{"model":"m","max_tokens":10,"messages":[{"role":"user","content":"` + long + `"}],"messages":[{"role":"user"}]}`, 1000 + 10},
		{"a Python spelling heavier", `{"model":"m","max_tokens":100,"MAX_TOKENS":1,"messages":[{"role":"user","content":"abcd"}]}`, 1 + 100},
	} {
		t.Run(tc.name, func(t *testing.T) {
			next := newHolder()
			req := newRequest(context.Background(), tc.body).start(h, next)
			next.waitEntered(t)
			assert.Equal(t, tc.want, h.engineList()[0].tokens.Load())
			next.release <- struct{}{}
			req.wait(t)
			settled(t, h)
		})
	}
}
