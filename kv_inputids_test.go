package caddyfairqueue

import (
	"context"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
)

// SGLang's chat request takes "input_ids", the prompt's tokens computed
// by the client, which it runs instead of the chat template's rendering
// of the messages: its ids are prompt tokens in the KV cache, one each,
// as a completions "prompt" of ids is, so that a chat body with a short
// message and 5000 ids is not weighed as its message alone.
func TestWeightCountsSGLangChatInputIDs(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	h := provisionLocal(t, newContext(t), &Handler{Name: "kv-input-ids", KVTokens: 1 << 20})
	ids := make([]string, 5000)
	for i := range ids {
		ids[i] = strconv.Itoa(i)
	}
	list := "[" + strings.Join(ids, ",") + "]"
	for _, tc := range []struct {
		name, body string
		want       int64
	}{
		{"chat", `{"model":"m","max_tokens":10,"messages":[{"role":"user","content":"abcd"}],"input_ids":` + list + `}`, 1 + 5000 + 10},
		{"chat, empty messages", `{"model":"m","max_tokens":10,"messages":[],"input_ids":` + list + `}`, 5000 + 10},
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

// A native /generate body of SGLang's "input_ids" names no prompt the
// weight reads as text: its bytes count, as any such body's do, but its
// ids are prompt tokens all the same, one each, however few bytes each
// takes ("1," is 2 bytes, half a token at 4 bytes a token).
func TestWeightCountsSGLangGenerateInputIDsOneTokenEach(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	h := provisionLocal(t, newContext(t), &Handler{Name: "kv-generate-input-ids", KVTokens: 1 << 20})
	ids := strings.TrimSuffix(strings.Repeat("1,", 100000), ",")
	for _, tc := range []struct {
		name, body string
		want       int64
	}{
		{"one prompt", `{"input_ids":[` + ids + `],"sampling_params":{"max_new_tokens":10}}`, 100000 + 10},
		{"a batch of two", `{"input_ids":[[` + ids + `],[` + ids + `]],"sampling_params":{"max_new_tokens":10}}`, 200000 + 2*10},
	} {
		t.Run(tc.name, func(t *testing.T) {
			next := newHolder()
			req := newRequest(context.Background(), tc.body)
			req.r.URL.Path = "/generate"
			req.start(h, next)
			next.waitEntered(t)
			assert.Equal(t, tc.want, h.engineList()[0].tokens.Load())
			next.release <- struct{}{}
			req.wait(t)
			settled(t, h)
		})
	}
}
