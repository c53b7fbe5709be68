package jsonscan

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

// Go's encoding/json, which reads Ollama's requests, decodes a repeated
// "messages" array into the elements of the one before: a client that
// sends its messages again without their content has Ollama run the
// first content. SniffFolded counts it (or more, never less); the
// exact-key reading (Python's json: the last array replaces the first)
// does not.
func TestSniffFoldedReadsARepeatedMessagesArrayAsGoDoes(t *testing.T) {
	for _, c := range []struct {
		name, body string
		want       int64
	}{
		{"a repeat without content keeps it",
			`{"model":"m","messages":[{"role":"user","content":"abcdef"}],"messages":[{"role":"user"}]}`, 6},
		{"a repeat with a null content keeps it",
			`{"messages":[{"content":"abcdef"}],"MESSAGES":[{"content":null}]}`, 6},
		{"a repeat's content replaces it",
			`{"messages":[{"content":"abcdef"}],"messages":[{"content":"xy"}]}`, 2},
		{"elements past a shorter repeat come back with a longer one",
			`{"messages":[{"content":"a0"},{"content":"a1"},{"content":"a2"}],"messages":[{"content":"b0"}],"messages":[{},{},{}]}`, 6},
		{"a shorter repeat counts its own elements",
			`{"messages":[{"content":"a0"},{"content":"a1"},{"content":"a2"}],"messages":[{"content":"b0"}]}`, 2},
		{"an empty array starts afresh",
			`{"messages":[{"content":"a0"},{"content":"a1"}],"messages":[],"messages":[{},{}]}`, 0},
		{"a null starts afresh",
			`{"messages":[{"content":"a0"}],"messages":null,"messages":[{}]}`, 0},
		{"tool calls merged into the ones before count the longer",
			`{"messages":[{"tool_calls":[{"function":{"name":"f","arguments":{"x":"long value"}}}]}],"messages":[{"tool_calls":[{}]}]}`,
			int64(len(`[{"function":{"name":"f","arguments":{"x":"long value"}}}]`))},
	} {
		t.Run(c.name, func(t *testing.T) {
			got := SniffFolded([]byte(c.body))
			assert.True(t, got.Prompt)
			assert.Equal(t, c.want, got.PromptBytes)
		})
	}
	// Python's json: the last array alone.
	assert.Equal(t, int64(0), Sniff([]byte(`{"messages":[{"content":"abcdef"}],"messages":[{"role":"user"}]}`)).PromptBytes)
}

// The same for Ollama's "tools": definitions sent again as {} keep what
// they had, and are rendered into the prompt.
func TestSniffFoldedReadsRepeatedToolsAsGoDoes(t *testing.T) {
	tools := `[{"type":"function","function":{"name":"get_weather","description":"a long description of the tool"}}]`
	body := `{"messages":[{"content":"hi"}],"tools":` + tools + `,"TOOLS":[{}]}`
	assert.Equal(t, int64(2+len(tools)), SniffFolded([]byte(body)).PromptBytes)
	assert.Equal(t, int64(2+len(`[{}]`)), SniffFolded([]byte(`{"messages":[{"content":"hi"}],"tools":`+tools+`,"tools":[],"tools":[{}]}`)).PromptBytes,
		"an empty array starts afresh")
	assert.Equal(t, int64(2+len(`[{}]`)), Sniff([]byte(`{"messages":[{"content":"hi"}],"tools":`+tools+`,"tools":[{}]}`)).PromptBytes,
		"Python's json: the last array alone")
}
