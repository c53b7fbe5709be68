package caddyfairqueue

import (
	"context"
	"encoding/base64"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A prompt's images and audio are prompt tokens in the KV cache (a
// vision model's hundreds to thousands per image), which the body's
// text does not show: each such part weighs media_tokens (default
// DefaultMediaTokens), so that a body of 20 base64 images and "hi" is
// not weighed as its two bytes of text.
func TestWeightCountsEachImageOrAudioPart(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	image := `{"type":"image_url","image_url":{"url":"data:image/png;base64,` + base64.StdEncoding.EncodeToString([]byte(strings.Repeat("x", 100<<10))) + `"}}`
	images := strings.Repeat(image+",", 20)
	audio := `{"type":"input_audio","input_audio":{"data":"UklGRg==","format":"wav"}}`
	byURL := `{"type":"image_url","image_url":{"url":"https://example.com/a.png"}}`
	for _, tc := range []struct {
		name, path, body string
		mediaTokens      int
		want             int64
	}{
		{"20 base64 images", "", `{"model":"m","max_tokens":10,"messages":[{"role":"user","content":[` + images + `{"type":"text","text":"hi"}]}]}`, 0, 20*DefaultMediaTokens + 1 + 10},
		{"20 base64 images, media_tokens 500", "", `{"model":"m","max_tokens":10,"messages":[{"role":"user","content":[` + images + `{"type":"text","text":"hi"}]}]}`, 500, 20*500 + 1 + 10},
		{"an image by URL and audio, in two messages", "", `{"model":"m","max_tokens":10,"messages":[{"role":"user","content":[` + byURL + `]},{"role":"user","content":[` + audio + `,{"type":"text","text":"abcd"}]}]}`, 0, 2*DefaultMediaTokens + 1 + 10},
		{"the Responses API's input_image", "/v1/responses", `{"model":"m","max_output_tokens":10,"input":[{"role":"user","content":[{"type":"input_image","image_url":"https://example.com/a.png"},{"type":"input_text","text":"abcd"}]}]}`, 0, DefaultMediaTokens + 1 + 10},
		{"Ollama's images", "/api/chat", `{"model":"m","options":{"num_predict":10},"messages":[{"role":"user","content":"abcd","images":["aGk=","aGk="]}]}`, 0, 2*DefaultMediaTokens + 1 + 10},
		{"Ollama's generate images", "/api/generate", `{"model":"m","options":{"num_predict":10},"prompt":"abcd","images":["aGk=","aGk=","aGk="]}`, 0, 3*DefaultMediaTokens + 1 + 10},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := provisionLocal(t, newContext(t), &Handler{Name: "kv-media-weight", KVTokens: 1 << 20, MediaTokens: tc.mediaTokens})
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

func TestCaddyfileAndJSONSetMediaTokens(t *testing.T) {
	h, err := parse("fair_queue {\nkv_tokens 200000\nmedia_tokens 256\n}")
	require.NoError(t, err)
	assert.Equal(t, 256, h.MediaTokens)
	assert.Equal(t, 256, h.mediaTokens())
	h, err = parse("fair_queue {\nkv_tokens 200000\n}")
	require.NoError(t, err)
	assert.Equal(t, DefaultMediaTokens, h.mediaTokens(), "unset: the default")

	for _, tc := range []struct{ name, body, wantErr string }{
		{"zero", "kv_tokens 10\nmedia_tokens 0", "media_tokens must be at least 1, got 0"},
		{"not a number", "kv_tokens 10\nmedia_tokens many", "media_tokens: 'many' is not an integer"},
		{"without tokens", "permits 1\nmedia_tokens 10", "media_tokens requires kv_tokens (on the queue or an upstream) or cost tokens"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := parse("fair_queue {\n" + tc.body + "\n}")
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.wantErr)
			assert.Contains(t, err.Error(), "Testfile:", "the error carries the file and line")
		})
	}
}

func TestJSONConfigErrorsOfMediaTokensNameTheField(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	for _, tc := range []struct{ name, fields, want string }{
		{"negative", `"kv_tokens":10,"media_tokens":-1`, `media_tokens must be at least 1, got -1`},
		{"a string", `"kv_tokens":10,"media_tokens":"many"`, `media_tokens: want an integer, got a string`},
		{"without tokens", `"permits":1,"media_tokens":10`, `media_tokens requires kv_tokens (on the queue or an upstream) or cost tokens`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := loadHandlerJSON(t, tc.fields)
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.want)
		})
	}
	require.NoError(t, loadHandlerJSON(t, `"kv_tokens":100000,"media_tokens":256`))
}

// SGLang takes an assistant message's reasoning as a content part
// {"type":"thinking","thinking":"..."} (or "reasoning"), text its chat
// template renders into the prompt: it weighs its text, as a "text"
// part does, not media_tokens.
func TestWeightCountsSGLangThinkingPartsAsText(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	thinking := strings.Repeat("step ", 8000) // 40,000 bytes: 10,000 tokens at 4 bytes each
	for _, typ := range []string{"thinking", "reasoning"} {
		t.Run(typ, func(t *testing.T) {
			h := provisionLocal(t, newContext(t), &Handler{Name: "kv-thinking-weight", KVTokens: 1 << 20})
			next := newHolder()
			req := newRequest(context.Background(), `{"model":"m","max_tokens":10,"messages":[{"role":"user","content":"abcd"},`+
				`{"role":"assistant","content":[{"type":"`+typ+`","thinking":"`+thinking+`"},{"type":"text","text":"abcd"}]},{"role":"user","content":"abcd"}]}`)
			req.start(h, next)
			next.waitEntered(t)
			assert.Equal(t, int64((len(thinking)+12)/4+10), h.engineList()[0].tokens.Load(), "the thinking text and the three messages' 4 bytes each, at 4 bytes a token, and the budget")
			next.release <- struct{}{}
			req.wait(t)
			settled(t, h)
		})
	}
}

// An assistant message's reasoning, replayed in a conversation's
// history, is text that a chat template of a reasoning model renders
// into the prompt (interleaved thinking): vLLM's "reasoning", SGLang's
// (and vLLM's older) "reasoning_content", Ollama's "thinking". It weighs
// its text, once where a client sends it under two of those keys (an
// answer of vLLM's, which holds both, sent back as it came).
func TestWeightCountsAnAssistantMessagesReasoning(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	reasoning := strings.Repeat("step ", 8000) // 40,000 bytes: 10,000 tokens at 4 bytes each
	for _, tc := range []struct{ name, path, fields string }{
		{"vLLM's reasoning", "", `"reasoning":"` + reasoning + `"`},
		{"SGLang's reasoning_content", "", `"reasoning_content":"` + reasoning + `"`},
		{"both, as vLLM answers", "", `"reasoning":"` + reasoning + `","reasoning_content":"` + reasoning + `"`},
		{"Ollama's thinking", "/api/chat", `"thinking":"` + reasoning + `"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := provisionLocal(t, newContext(t), &Handler{Name: "kv-reasoning-weight", KVTokens: 1 << 20})
			next := newHolder()
			req := newRequest(context.Background(), `{"model":"m","max_tokens":10,"options":{"num_predict":10},"messages":[{"role":"user","content":"abcd"},`+
				`{"role":"assistant",`+tc.fields+`,"content":"abcd"},{"role":"user","content":"abcd"}]}`)
			if tc.path != "" {
				req.r.URL.Path = tc.path
			}
			req.start(h, next)
			next.waitEntered(t)
			assert.Equal(t, int64((len(reasoning)+12)/4+10), h.engineList()[0].tokens.Load(), "the reasoning and the three messages' 4 bytes each, at 4 bytes a token, and the budget")
			next.release <- struct{}{}
			req.wait(t)
			settled(t, h)
		})
	}
}

// vLLM's and SGLang's tool_reference part ({"type":"tool_reference",
// "name":"..."}: GLM's deferred tools) names a tool whose definition the
// chat template renders from "tools", already counted: it is no image,
// and does not weigh media_tokens.
func TestWeightOfAToolReferencePartIsNoMedia(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	h := provisionLocal(t, newContext(t), &Handler{Name: "kv-tool-reference", KVTokens: 1 << 20})
	next := newHolder()
	refs := strings.Repeat(`{"type":"tool_reference","name":"read"},`, 20)
	req := newRequest(context.Background(), `{"model":"m","max_tokens":10,"messages":[{"role":"user","content":"abcd"},`+
		`{"role":"tool","tool_call_id":"c1","content":[`+refs+`{"type":"text","text":"abcd"}]}]}`)
	req.start(h, next)
	next.waitEntered(t)
	assert.Equal(t, int64(2+10), h.engineList()[0].tokens.Load(), "the two messages' 4 bytes each, at 4 bytes a token, and the budget")
	next.release <- struct{}{}
	req.wait(t)
	settled(t, h)
}
