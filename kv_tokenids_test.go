package caddyfairqueue

import (
	"context"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
)

// ids is a JSON array of count token ids.
func ids(count int) string {
	s := make([]string, count)
	for i := range s {
		s[i] = strconv.Itoa(1000 + i)
	}
	return "[" + strings.Join(s, ",") + "]"
}

// A prompt sent as token ids (vLLM's and SGLang's completions "prompt":
// [ids], embeddings' "input": [ids], Ollama generate's "context" of a
// previous answer) is that many tokens in the backend's KV cache: the
// weight counts each id as a token, not the prompt as empty.
func TestWeightCountsAPromptSentAsTokenIDs(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	h := provisionLocal(t, newContext(t), &Handler{Name: "kv-token-ids", KVTokens: 100000})
	for _, tc := range []struct {
		name, body string
		want       int64
		path       string // default /v1/chat/completions
	}{
		{"completions prompt of ids", `{"model":"m","max_tokens":10,"prompt":` + ids(400) + `}`, 400 + 10, ""},
		{"a batch of id prompts", `{"model":"m","max_tokens":10,"prompt":[` + ids(300) + `,` + ids(100) + `]}`, 400 + 2*10, ""},
		{"Ollama generate with a context", `{"model":"m","prompt":"abcd","context":` + ids(500) + `,"options":{"num_predict":10}}`, 1 + 500 + 10, "/api/generate"},
		{"embeddings input of ids", `{"model":"e","max_tokens":10,"input":[` + ids(200) + `,` + ids(50) + `]}`, 250 + 10, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			next := newHolder()
			req := newRequest(context.Background(), tc.body)
			if tc.path != "" {
				req.r.URL.Path = tc.path
			}
			req.start(h, next)
			next.waitEntered(t)
			assert.Equal(t, tc.want, h.engineList()[0].tokens.Load())
			next.release <- struct{}{}
			req.wait(t)
			settled(t, h)
		})
	}
}
