package jsonscan

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

// vLLM renders a chat request's "documents" and SGLang and vLLM its
// "chat_template_kwargs" through the chat template: their JSON counts as
// the prompt's text, as tools' does, with the exact keys pydantic reads
// (Ollama reads neither: SniffFolded counts neither).
func TestSniffCountsTheChatTemplatesDocumentsAndArguments(t *testing.T) {
	docs := `[{"title":"t","text":"0123456789"}]`
	kwargs := `{"x":"0123456789"}`
	for _, tc := range []struct {
		name, body    string
		exact, folded int64
	}{
		{"documents", `{"messages":[{"content":"ab"}],"documents":` + docs + `}`, 2 + int64(len(docs)), 2},
		{"chat_template_kwargs", `{"chat_template_kwargs":` + kwargs + `,"messages":[{"content":"ab"}]}`, 2 + int64(len(kwargs)), 2},
		{"the last of a repeat", `{"documents":` + docs + `,"messages":[{"content":"ab"}],"documents":[],"chat_template_kwargs":` + kwargs + `,"chat_template_kwargs":null}`, 2 + 2, 2},
		{"another spelling: not pydantic's", `{"Documents":` + docs + `,"CHAT_TEMPLATE_KWARGS":` + kwargs + `,"messages":[{"content":"ab"}]}`, 2, 2},
		{"another type: none", `{"documents":"abc","chat_template_kwargs":[1],"messages":[{"content":"ab"}]}`, 2, 2},
		{"without a prompt: the body counts", `{"documents":` + docs + `}`, 0, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.exact, Sniff([]byte(tc.body)).PromptBytes)
			assert.Equal(t, tc.folded, SniffFolded([]byte(tc.body)).PromptBytes)
			assert.Equal(t, tc.exact, SniffEither([]byte(tc.body)).PromptBytes, "the heavier reading")
		})
	}
}
