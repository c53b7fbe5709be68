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
