package caddyfairqueue

import (
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// longUsageOf writes stream to a usageWriter of an SSE response in
// writes of size bytes, checking that the line buffer stays bounded, and
// returns the usage found and its prompt tokens.
func longUsageOf(t *testing.T, stream string, size int) (total float64, ok bool, prompt float64, promptOK bool) {
	t.Helper()
	rec := httptest.NewRecorder()
	u := newUsageWriter(rec)
	u.Header().Set("Content-Type", "text/event-stream")
	for i := 0; i < len(stream); i += size {
		n, err := u.Write([]byte(stream[i:min(i+size, len(stream))]))
		require.NoError(t, err)
		require.Equal(t, min(size, len(stream)-i), n)
		require.LessOrEqual(t, cap(u.line), 2*maxSSELine, "the line buffer is bounded")
	}
	require.Equal(t, stream, rec.Body.String(), "the response passes unchanged")
	total, ok = u.totalTokens()
	prompt, promptOK = u.promptTokens()
	return total, ok, prompt, promptOK
}

// longText is an answer's text far beyond maxSSELine.
var longText = strings.Repeat("All work and no play makes Jack a dull boy. ", 4*maxSSELine/44)

// An over-long data line is read from its tail: a Responses API
// response.completed event's response.usage, an OpenAI chunk's usage,
// however the line is written.
func TestUsageFromTheTailOfALongSSEDataLine(t *testing.T) {
	completed := "event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"delta\":\"All\"}\n\n" +
		responsesCompleted(longText, realUsage)
	chunk := "data: {\"id\":\"c\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"" + longText + "\"}}]," +
		"\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":4,\"total_tokens\":7}}\n\ndata: [DONE]\n\n"
	for _, size := range []int{1, 1000, 32 << 10, len(completed)} {
		total, ok, prompt, promptOK := longUsageOf(t, completed, size)
		assert.True(t, ok, "response.usage, writes of %d", size)
		assert.Equal(t, 100.0, total)
		assert.True(t, promptOK)
		assert.Equal(t, 40.0, prompt, "input_tokens")

		total, ok, _, _ = longUsageOf(t, chunk, size)
		assert.True(t, ok, "usage, writes of %d", size)
		assert.Equal(t, 7.0, total)
	}
	// A "usage" deeper in the response after the real one (a format's
	// schema) is passed over.
	total, ok, _, _ := longUsageOf(t, "data: {\"type\":\"response.completed\",\"response\":{\"output_text\":\""+longText+"\","+
		"\"usage\":{\"total_tokens\":100},\"text\":{\"format\":{\"usage\":{\"total_tokens\":6}}},\"user\":null}}\n\n", 4096)
	assert.True(t, ok)
	assert.Equal(t, 100.0, total)

	// A last line without its newline.
	total, ok, _, _ = longUsageOf(t, strings.TrimSuffix(responsesCompleted(longText, realUsage), "\n\n"), 4096)
	assert.True(t, ok)
	assert.Equal(t, 100.0, total)
}

// Only the usage of the line's object, or of an object in it (the
// Responses API's response), counts: not a "usage" in an answer's text,
// not one deeper in the response (a tool's schema, a format), not one
// in a line other than data, not one cut by the tail's start.
func TestUsageFromTheTailOfALongSSELineTakesOnlyTheRealUsage(t *testing.T) {
	spoof := `Here is JSON: {\"usage\":{\"total_tokens\":5}}}},\"usage\":{\"total_tokens\":5}}}`
	for name, stream := range map[string]string{
		"in the text, usage null":       responsesCompleted(longText+spoof, "null"),
		"in the text at the line's end": "data: {\"choices\":[{\"delta\":{\"content\":\"" + longText + spoof + "\"}}]}\n\n",
		"deeper in the response": "data: {\"type\":\"response.completed\",\"response\":{\"output_text\":\"" + longText + "\"," +
			"\"usage\":null,\"tools\":[{\"parameters\":{\"properties\":{\"usage\":{\"total_tokens\":5}}}}]," +
			"\"text\":{\"format\":{\"usage\":{\"total_tokens\":6}}},\"user\":null}}\n\n",
		"a key ending in usage": "data: {\"pad\":\"" + longText + "\",\"x\\\"usage\":{\"total_tokens\":5}}\n\n",
		"not a data line":       ": " + longText + "\"usage\":{\"total_tokens\":5}}\n\n",
		"cut by the tail": "data: {\"type\":\"response.completed\",\"response\":{\"usage\":{\"total_tokens\":5},\"metadata\":{\"k\":\"" +
			longText + "\"}}}\n\n",
	} {
		_, ok, _, _ := longUsageOf(t, stream, 4096)
		assert.False(t, ok, name)
	}

	// A usage read before stands: the long line without one changes nothing.
	total, ok, _, _ := longUsageOf(t, "data: {\"usage\":{\"total_tokens\":8}}\n\n"+responsesCompleted(longText+spoof, "null"), 4096)
	assert.True(t, ok)
	assert.Equal(t, 8.0, total)
}
