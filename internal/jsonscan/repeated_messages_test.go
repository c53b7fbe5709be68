package jsonscan

import (
	"runtime"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
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

// A repeat reads into the messages before it, as Go's decoder does,
// without copying them: a body (on /api/chat, of up to max_body, 8 MiB
// by default) with one long array and many short repeats after it
// (`"messages":[{}]`, 16 bytes each) copied the long one again at every
// repeat, memory and time growing with their product. Here 2,000
// repeats of a 10,000-message array, a 62 KiB body, allocated about
// 500 MB; the memory read now grows with the body.
func TestSniffFoldedReadsRepeatedMessagesInMemoryThatGrowsWithTheBody(t *testing.T) {
	var b strings.Builder
	b.WriteString(`{"messages":[{"content":"abcdef"}`)
	for range 9999 {
		b.WriteString(`,{}`)
	}
	b.WriteString(`]`)
	for range 2000 {
		b.WriteString(`,"messages":[{}]`)
	}
	b.WriteString(`}`)
	body := []byte(b.String())

	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	f := SniffFolded(body)
	runtime.ReadMemStats(&after)
	require.True(t, f.Prompt)
	assert.Equal(t, int64(6), f.PromptBytes, "the first message's content, kept by every repeat")
	alloc := after.TotalAlloc - before.TotalAlloc
	assert.Less(t, alloc, uint64(64*len(body)), "bytes allocated reading a %d-byte body", len(body))
}
