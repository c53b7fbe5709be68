package caddyfairqueue

import (
	"context"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
)

// A chat backend (vLLM, SGLang, Ollama) renders the request's tool
// definitions ("tools", the older "functions") and the assistant
// messages' "tool_calls" into the prompt its chat template makes: they
// are prompt tokens in the KV cache. The weight counts their bytes as
// the prompt's text, so that an agent's long tool list, or a client
// that moves its prompt there, is not weighed as a short chat.
func TestWeightCountsToolDefinitionsAndCalls(t *testing.T) {
	t.Cleanup(func() { poolEmpty(t) })
	h := provisionLocal(t, newContext(t), &Handler{Name: "kv-tools", KVTokens: 100000})
	desc := strings.Repeat("d", 4000)
	tools := `[{"type":"function","function":{"name":"f","description":"` + desc + `"}}]`
	functions := `[{"name":"f","description":"` + desc + `"}]`
	calls := `[{"id":"c","type":"function","function":{"name":"f","arguments":"` + strings.Repeat("a", 4000) + `"}}]`
	hi := `{"role":"user","content":"abcd"}`
	for _, tc := range []struct {
		name, body string
		want       int64
	}{
		{"tools", `{"model":"m","max_tokens":10,"tools":` + tools + `,"messages":[` + hi + `]}`, int64(len(tools)+4+3)/4 + 10},
		{"functions", `{"model":"m","max_tokens":10,"functions":` + functions + `,"messages":[` + hi + `]}`, int64(len(functions)+4+3)/4 + 10},
		{"an assistant's tool calls", `{"model":"m","max_tokens":10,"messages":[` + hi + `,{"role":"assistant","tool_calls":` + calls + `}]}`, int64(len(calls)+4+3)/4 + 10},
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
