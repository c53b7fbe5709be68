package caddyfairqueue

import (
	"context"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
)

// vLLM's chat request takes "documents" (a RAG request's documents,
// which a chat template that supports them renders into the prompt) and
// "chat_template_kwargs" (values handed to the chat template, which some
// templates render); SGLang takes the latter. Both are prompt tokens in
// the KV cache: the weight counts their JSON as the prompt's text, as it
// counts tool definitions, so that a client moving its prompt there is
// not weighed as the two bytes of its message.
func TestWeightCountsRAGDocumentsAndTemplateArguments(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	h := provisionLocal(t, newContext(t), &Handler{Name: "kv-documents", KVTokens: 1 << 20})
	text := strings.Repeat("d", 4000)
	documents := `[{"title":"t","text":"` + text + `"},{"title":"u","text":"` + text + `"}]`
	kwargs := `{"context":"` + text + `","enable_thinking":false}`
	hi := `{"role":"user","content":"abcd"}`
	for _, tc := range []struct {
		name, body string
		want       int64
	}{
		{"documents", `{"model":"m","max_tokens":10,"documents":` + documents + `,"messages":[` + hi + `]}`, int64(len(documents)+4+3)/4 + 10},
		{"chat_template_kwargs", `{"model":"m","max_tokens":10,"chat_template_kwargs":` + kwargs + `,"messages":[` + hi + `]}`, int64(len(kwargs)+4+3)/4 + 10},
		{"both, repeated: the last of each", `{"model":"m","max_tokens":10,"documents":[],"chat_template_kwargs":{},"messages":[` + hi + `],"documents":` + documents + `,"chat_template_kwargs":` + kwargs + `}`, int64(len(documents)+len(kwargs)+4+3)/4 + 10},
		{"a null: none", `{"model":"m","max_tokens":10,"documents":null,"chat_template_kwargs":null,"messages":[` + hi + `]}`, 1 + 10},
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
