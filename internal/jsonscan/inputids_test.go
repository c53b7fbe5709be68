package jsonscan

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

// SGLang's "input_ids" (a chat request's prompt as token ids, which it
// runs instead of the rendered messages, or a native /generate's prompts)
// are prompt tokens, one a number, read with pydantic's exact key
// (Ollama reads no such key).
func TestSniffCountsSGLangInputIDsAsPromptTokens(t *testing.T) {
	for _, tc := range []struct {
		name, body    string
		exact, folded int64
	}{
		{"one prompt", `{"messages":[],"input_ids":[1,2,3]}`, 3, 0},
		{"a batch", `{"input_ids":[[1,2],[3,4,5]],"text":"x"}`, 5, 0},
		{"the last of a repeat", `{"input_ids":[1,2,3],"messages":[],"input_ids":[4]}`, 1, 0},
		{"another spelling: not pydantic's", `{"messages":[],"INPUT_IDS":[1,2,3]}`, 0, 0},
		{"another type: none", `{"messages":[],"input_ids":"123"}`, 0, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.exact, Sniff([]byte(tc.body)).PromptTokens)
			assert.Equal(t, tc.folded, SniffFolded([]byte(tc.body)).PromptTokens)
			assert.Equal(t, tc.exact, SniffEither([]byte(tc.body)).PromptTokens, "the heavier reading")
		})
	}
}
