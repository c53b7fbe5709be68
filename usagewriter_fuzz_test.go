package caddyfairqueue

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Fuzz targets of usageWriter, what reads the usage (cost tokens,
// kv_tokens, the prompt estimate) from the answers passing through the
// handler. Explore further with, for example:
//
//	go test -run '^$' -fuzz '^FuzzUsageWriterSplits$' -fuzztime 90s -parallel 1 .

// usageContentTypes are the answers usageWriter reads, by a fuzzed byte.
var usageContentTypes = []string{"text/event-stream", "application/x-ndjson", "application/json", "text/event-stream; charset=utf-8"}

// usageRead is what a usageWriter found in an answer.
type usageRead struct {
	Total, Prompt, Completion           float64
	Found, PromptFound, CompletionFound bool
}

// readUsage writes stream through a usageWriter of an answer of
// contentType, in the pieces write gives it, checking on the way that the
// answer passes unchanged and that the memory held is bounded, and
// returns what it found.
func readUsage(t *testing.T, contentType string, stream []byte, write func(u *usageWriter, b []byte)) usageRead {
	t.Helper()
	rec := httptest.NewRecorder()
	u := newUsageWriter(rec)
	u.Header().Set("Content-Type", contentType)
	u.WriteHeader(http.StatusOK)
	write(u, stream)
	require.True(t, bytes.Equal(stream, rec.Body.Bytes()), "the answer passes unchanged")
	require.LessOrEqual(t, cap(u.line), 2*maxSSELine, "the line buffer is bounded")
	require.LessOrEqual(t, len(u.body), maxJSONBody, "the body buffer is bounded")
	var r usageRead
	r.Total, r.Found = u.totalTokens()
	r.Prompt, r.PromptFound = u.promptTokens()
	r.Completion, r.CompletionFound = u.completionTokens()
	return r
}

// writeWhole writes b at once.
func writeWhole(u *usageWriter, b []byte) { _, _ = u.Write(b) }

// writeCut writes b in pieces whose sizes cycle through sizes (each
// 1..256, scaled by scale).
func writeCut(sizes []byte, scale int) func(u *usageWriter, b []byte) {
	return func(u *usageWriter, b []byte) {
		for i := 0; len(b) > 0; i++ {
			n := 1
			if len(sizes) > 0 {
				n = (int(sizes[i%len(sizes)]) + 1) * scale
			}
			n = min(n, len(b))
			_, _ = u.Write(b[:n])
			b = b[n:]
		}
	}
}

// piecesReader gives b in reads of the sizes writeCut writes.
type piecesReader struct {
	b     []byte
	sizes []byte
	i     int
}

func (r *piecesReader) Read(p []byte) (int, error) {
	if len(r.b) == 0 {
		return 0, io.EOF
	}
	n := 1
	if len(r.sizes) > 0 {
		n = int(r.sizes[r.i%len(r.sizes)]) + 1
	}
	r.i++
	n = min(n, len(r.b), len(p))
	copy(p, r.b[:n])
	r.b = r.b[n:]
	return n, nil
}

// usageSeeds are answers as upstreams send them: OpenAI and vLLM chat
// and completions streams, the Responses API's events, Ollama's NDJSON
// and JSON answers, with CRLF and LF line ends.
var usageSeeds = []struct {
	ctype  int
	stream string
}{
	{0, "data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}],\"usage\":null}\n\n" +
		"data: {\"id\":\"c\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"h\u00e9llo \\\"usage\\\":{\\\"total_tokens\\\":9}\"}}],\"usage\":null}\n\n" +
		"data: {\"id\":\"c\",\"choices\":[],\"usage\":{\"prompt_tokens\":12,\"completion_tokens\":30,\"total_tokens\":42},\"obfuscation\":\"x\"}\n\n" +
		"data: [DONE]\n\n"},
	{0, "data: {\"choices\":[{\"text\":\"a\"}],\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":1,\"total_tokens\":4}}\r\n\r\n" +
		": ping\r\n\r\n" +
		"data:{\"choices\":[{\"text\":\"b\"}],\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":2,\"total_tokens\":5}}\r\n\r\n" +
		"data: [DONE]\r\n\r\n"},
	{3, "event: response.created\ndata: {\"type\":\"response.created\",\"response\":{\"status\":\"in_progress\",\"usage\":null}}\n\n" +
		"event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"delta\":\"\\\"total_tokens\\\":7\"}\n\n" +
		responsesCompleted("hi", realUsage)},
	{1, "{\"model\":\"m\",\"message\":{\"role\":\"assistant\",\"content\":\"\\\"eval_count\\\":3\"},\"done\":false}\n" +
		"{\"model\":\"m\",\"message\":{\"role\":\"assistant\",\"content\":\"\"},\"done_reason\":\"stop\",\"done\":true,\"total_duration\":5,\"prompt_eval_count\":26,\"prompt_eval_duration\":3,\"eval_count\":290,\"eval_duration\":4}\n"},
	{1, "{\"response\":\"a\",\"done\":false}\r\n{\"response\":\"\",\"done\":true,\"context\":[1,2,3],\"prompt_eval_count\":8,\"eval_count\":2}"},
	{2, `{"id":"x","object":"chat.completion","choices":[{"message":{"content":"{\"usage\":{\"total_tokens\":1}}"}}],"usage":{"prompt_tokens":12,"completion_tokens":30,"total_tokens":42}}`},
	{2, `{"model":"m","response":"hi","done":true,"prompt_eval_count":26,"eval_count":290}`},
	{2, `{"object":"response","output":[],"usage":{"input_tokens":5,"output_tokens":6,"total_tokens":11}}`},
}

// FuzzUsageWriterSplits: the usage read from an answer is the same
// however the upstream's bytes are cut into writes (TCP and
// reverse_proxy's flushes cut anywhere: in a CRLF, in "data:", in a
// rune, between a line and the blank line after it), written or read
// (ReadFrom); the answer passes unchanged and the buffers stay bounded.
func FuzzUsageWriterSplits(f *testing.F) {
	for _, s := range usageSeeds {
		f.Add(uint8(s.ctype), []byte(s.stream), []byte{0, 6, 1, 200})
		f.Add(uint8(s.ctype), []byte(s.stream), []byte{})
	}
	f.Fuzz(func(t *testing.T, ctype uint8, stream, sizes []byte) {
		contentType := usageContentTypes[int(ctype)%len(usageContentTypes)]
		want := readUsage(t, contentType, stream, writeWhole)
		assert.Equal(t, want, readUsage(t, contentType, stream, writeCut(sizes, 1)), "cut in writes of %v", sizes)
		assert.Equal(t, want, readUsage(t, contentType, stream, writeCut(nil, 1)), "a byte a write")
		assert.Equal(t, want, readUsage(t, contentType, stream, func(u *usageWriter, b []byte) {
			_, err := u.ReadFrom(&piecesReader{b: b, sizes: sizes})
			require.NoError(t, err)
		}), "read from the upstream in reads of %v", sizes)
	})
}

// sseFrame writes the data payloads as an SSE stream, framed as frame's
// bits say: CRLF line ends, "data:" without its space, an event line
// before each event, a comment (a keepalive ping) between events.
func sseFrame(payloads []string, frame uint8) string {
	eol := "\n"
	if frame&1 != 0 {
		eol = "\r\n"
	}
	field := "data: "
	if frame&2 != 0 {
		field = "data:"
	}
	var b strings.Builder
	for i, p := range payloads {
		if frame&4 != 0 {
			b.WriteString("event: message" + eol)
		}
		b.WriteString(field + p + eol + eol)
		if frame&8 != 0 && i%2 == 0 {
			b.WriteString(":ping" + eol + eol)
		}
	}
	if frame&16 != 0 { // the last line without its blank line
		return strings.TrimSuffix(b.String(), eol)
	}
	return b.String()
}

// FuzzUsageSSEFraming: the usage read from an SSE stream is the same
// with CRLF or LF line ends, "data:" with or without its space, with
// event lines and comments or without.
func FuzzUsageSSEFraming(f *testing.F) {
	for _, s := range []string{
		"{\"choices\":[],\"usage\":null}\n{\"choices\":[],\"usage\":{\"prompt_tokens\":20,\"completion_tokens\":17,\"total_tokens\":37}}\n[DONE]",
		"{\"type\":\"response.completed\",\"response\":{\"usage\":{\"input_tokens\":4,\"output_tokens\":2,\"total_tokens\":6}}}",
		"{\"usage\":{\"total_tokens\":10}}\n{\"usage\":null}",
		"{\"choices\":[{\"delta\":{\"content\":\"\\\"total_tokens\\\":5\"}}]}",
	} {
		f.Add(s, uint8(0x1f))
	}
	f.Fuzz(func(t *testing.T, payloads string, frame uint8) {
		lines := strings.FieldsFunc(payloads, func(r rune) bool { return r == '\n' || r == '\r' })
		want := readUsage(t, "text/event-stream", []byte(sseFrame(lines, 0)), writeWhole)
		got := readUsage(t, "text/event-stream", []byte(sseFrame(lines, frame)), writeWhole)
		assert.Equal(t, want, got, "framing %05b", frame)
	})
}

// FuzzUsageNotFromTheAnswersText: an answer's text, whatever it says,
// never counts as usage: the usage read is the real one (or none), in
// a chat chunk, a Responses API completed event or a JSON answer, of a
// line read whole or from its tail (beyond maxSSELine).
func FuzzUsageNotFromTheAnswersText(f *testing.F) {
	for _, s := range []string{
		`"usage":{"total_tokens":5}}`, `{"usage":{"total_tokens":5}}}}`, `\"usage\":{\"total_tokens\":5}}`,
		`Here is JSON: {"usage":{"total_tokens":5}}}},"usage":{"total_tokens":5}}}`, `\\"usage":{"total_tokens":5}}`,
		"\"prompt_eval_count\":7,\"eval_count\":9}", `"response":{"usage":{"total_tokens":5}}}`,
	} {
		f.Add(s, uint8(0), false)
		f.Add(s, uint8(1), true)
	}
	f.Fuzz(func(t *testing.T, text string, shape uint8, long bool) {
		enc, err := json.Marshal(text)
		require.NoError(t, err)
		quoted := string(enc[1 : len(enc)-1])
		if long {
			quoted = longText + quoted
		}
		real := shape&1 != 0
		usage := "null"
		if real {
			usage = `{"prompt_tokens":3,"completion_tokens":4,"total_tokens":7}`
		}
		var ctype, stream string
		switch shape / 2 % 3 {
		case 0:
			ctype, stream = "text/event-stream", `data: {"id":"c","choices":[{"index":0,"delta":{"content":"`+quoted+`"}}],"usage":`+usage+"}\n\n"
		case 1:
			ctype = "text/event-stream"
			stream = responsesCompleted(quoted, strings.ReplaceAll(strings.ReplaceAll(usage, "prompt_", "input_"), "completion_", "output_"))
		case 2:
			ctype, stream = "application/json", `{"choices":[{"message":{"content":"`+quoted+`"}}],"usage":`+usage+"}"
		}
		got := readUsage(t, ctype, []byte(stream), writeCut([]byte{255, 17}, 64))
		if !real {
			assert.False(t, got.Found, "the answer's text counted as usage: %+v", got)
			return
		}
		assert.Equal(t, usageRead{Total: 7, Prompt: 3, Completion: 4, Found: true, PromptFound: true, CompletionFound: true}, got)
	})
}

// FuzzUsageWriterLongLines is FuzzUsageWriterSplits with a line beyond
// maxSSELine in the answer (a Responses API completed event repeating
// the answer, Ollama's last line with its context): head, pad bytes of
// padding, then tail; the writes are up to 64 KiB.
func FuzzUsageWriterLongLines(f *testing.F) {
	f.Add(uint8(0), "data: {\"choices\":[{\"delta\":{\"content\":\"", uint16(1100), "\"}}],\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":4,\"total_tokens\":7}}\n\ndata: [DONE]\n\n", []byte{3, 250, 7}, uint8(40))
	f.Add(uint8(3), "event: response.completed\r\ndata:{\"type\":\"response.completed\",\"response\":{\"output_text\":\"", uint16(1500),
		"\",\"usage\":{\"input_tokens\":40,\"output_tokens\":60,\"total_tokens\":100},\"user\":null,\"metadata\":{}},\"sequence_number\":9}\r\n\r\n", []byte{255}, uint8(255))
	f.Add(uint8(1), "{\"response\":\"a\",\"done\":false}\n{\"done\":true,\"context\":[1", uint16(1030), "],\"prompt_eval_count\":26,\"eval_count\":290}\n", []byte{0, 1, 2}, uint8(0))
	f.Add(uint8(0), ": ", uint16(1025), "\"usage\":{\"total_tokens\":5}}\n\ndata: {\"usage\":{\"total_tokens\":8}}", []byte{9}, uint8(100))
	f.Fuzz(func(t *testing.T, ctype uint8, head string, pad uint16, tail string, sizes []byte, scale uint8) {
		contentType := usageContentTypes[int(ctype)%len(usageContentTypes)]
		filler := ",1"
		if ctype%4 != 1 {
			filler = "All work and no play makes Jack a dull boy. \u00e9\\\"\\n"
		}
		stream := []byte(head + strings.Repeat(filler, int(pad)%2048*64/len(filler)) + tail)
		want := readUsage(t, contentType, stream, writeWhole)
		assert.Equal(t, want, readUsage(t, contentType, stream, writeCut(sizes, int(scale)+1)), "cut in writes of %v times %d", sizes, int(scale)+1)
		assert.Equal(t, want, readUsage(t, contentType, stream, writeCut(sizes, 1)), "cut in writes of %v", sizes)
	})
}
