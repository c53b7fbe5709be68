package caddyfairqueue

import (
	"context"
	"math"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
)

// TGI's and SGLang's native /generate (and TGI's /generate_stream) read
// the completion budget from "parameters": {"max_new_tokens"} (TGI) and
// "sampling_params": {"max_new_tokens"} (SGLang), the completions from
// TGI's "best_of", SGLang's "n" and a batch of SGLang prompts ("text",
// "input_ids"; a batch's "sampling_params" may be a list, one object for
// each prompt, of which the heaviest counts for each): such a request is weighed by them, as an
// OpenAI-compatible one is by max_tokens and n, or by these where they
// are heavier (vLLM's demo api_server serves /generate too, and reads
// them); other paths know no such keys. Before, a native request was weighed by the default budget
// whatever it asked for: 100,000 new tokens held the KV cache of 500.
func TestANativeGenerateRequestIsWeighedByItsMaxNewTokens(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	h := provisionLocal(t, newContext(t), &Handler{Name: "kv-native-generate", KVTokens: 1000000, DefaultMaxTokens: 500})
	for _, tc := range []struct {
		name, path, body string
		budget           int64 // the prompt's, the body's bytes at 4 a token, comes on top
	}{
		{"TGI", "/generate", `{"inputs":"abcd","parameters":{"max_new_tokens":100000}}`, 100000},
		{"TGI, streamed", "/generate_stream", `{"inputs":"abcd","parameters":{"max_new_tokens":100000}}`, 100000},
		{"TGI best_of", "/generate", `{"inputs":"abcd","parameters":{"max_new_tokens":100,"best_of":4}}`, 4 * 100},
		{"SGLang", "/generate", `{"text":"abcd","sampling_params":{"max_new_tokens":100000}}`, 100000},
		{"SGLang n", "/generate", `{"text":"abcd","sampling_params":{"max_new_tokens":100,"n":3}}`, 3 * 100},
		{"SGLang, a batch", "/generate", `{"text":["a","b","c"],"sampling_params":{"max_new_tokens":100}}`, 3 * 100},
		{"SGLang, a batch of ids", "/generate", `{"input_ids":[[1,2],[3]],"sampling_params":{"max_new_tokens":100}}`, 2 * 100},
		{"SGLang, a batch with its own sampling_params each", "/generate",
			`{"text":["a","b"],"sampling_params":[{"max_new_tokens":100000},{"max_new_tokens":10}]}`, 2 * 100000},
		{"SGLang, a batch sampling n each", "/generate",
			`{"text":["a","b"],"sampling_params":[{"max_new_tokens":1000,"n":3},{"max_new_tokens":1000,"n":3}]}`, 2 * 3 * 1000},
		{"behind a prefix", "/tgi/generate/", `{"inputs":"abcd","parameters":{"max_new_tokens":3000}}`, 3000},
		{"none set", "/generate", `{"inputs":"abcd","parameters":{"temperature":0.5}}`, 500},
		{"max_tokens is not TGI's", "/generate", `{"inputs":"abcd","max_tokens":1,"parameters":{"max_new_tokens":3000}}`, 3000},
		{"vLLM's demo server", "/generate", `{"prompt":"abcd","max_tokens":3000,"n":2}`, 2 * 3000},
		{"not read on an OpenAI path", "/v1/completions", `{"model":"m","prompt":"abcd","parameters":{"max_new_tokens":3000}}`, 500},
		{"nor on Ollama's", "/api/generate", `{"model":"m","prompt":"abcd","parameters":{"max_new_tokens":3000}}`, 500},
	} {
		t.Run(tc.name, func(t *testing.T) {
			prompt := int64(math.Ceil(float64(len(tc.body)) / 4)) // no prompt key read: the whole body
			if strings.Contains(tc.body, `"prompt":"abcd"`) {
				prompt = 1 // a prompt read: "abcd"
			}
			next := newHolder()
			req := newRequest(context.Background(), tc.body)
			req.r.URL.Path = tc.path
			req.start(h, next)
			next.waitEntered(t)
			assert.Equal(t, prompt+tc.budget, h.engineList()[0].tokens.Load())
			next.release <- struct{}{}
			req.wait(t)
			settled(t, h)
		})
	}
}
