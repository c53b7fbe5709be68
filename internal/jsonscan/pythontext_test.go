package jsonscan

import (
	"encoding/binary"
	"testing"
	"unicode/utf16"

	"github.com/stretchr/testify/assert"
)

// encodeUTF16 is s in UTF-16, little or big endian, after a byte order
// mark if bom.
func encodeUTF16(s string, order binary.AppendByteOrder, bom bool) []byte {
	var b []byte
	units := utf16.Encode([]rune(s))
	if bom {
		units = append([]uint16{0xfeff}, units...)
	}
	for _, u := range units {
		b = order.AppendUint16(b, u)
	}
	return b
}

// encodeUTF32 is s in UTF-32, little or big endian, after a byte order
// mark if bom.
func encodeUTF32(s string, order binary.AppendByteOrder, bom bool) []byte {
	var b []byte
	if bom {
		b = order.AppendUint32(b, 0xfeff)
	}
	for _, r := range s {
		b = order.AppendUint32(b, uint32(r))
	}
	return b
}

// Python's json.loads, which FastAPI reads a JSON body with (vLLM,
// SGLang), takes bytes in UTF-16 or UTF-32 as well as UTF-8: it tells
// them by a byte order mark, or by the zero bytes around the '{'
// (json.detect_encoding). Such a body is read as Python reads it: its
// model names its queue and its max_tokens weighs it, as the backend
// runs it. Before, it was read as unreadable: no model (the default
// queue, not the model's) and no max_tokens (the default budget, for a
// body that asks 100,000).
func TestSniffReadsAUTF16OrUTF32BodyAsPythonDoes(t *testing.T) {
	body := `{"model":"bïg","max_tokens":100000,"stream":true,"messages":[{"role":"user","content":"abcé"}]}`
	for _, tc := range []struct {
		name string
		b    []byte
	}{
		{"utf-16-le", encodeUTF16(body, binary.LittleEndian, false)},
		{"utf-16-be", encodeUTF16(body, binary.BigEndian, false)},
		{"utf-16 with a little-endian mark", encodeUTF16(body, binary.LittleEndian, true)},
		{"utf-16 with a big-endian mark", encodeUTF16(body, binary.BigEndian, true)},
		{"utf-32-le", encodeUTF32(body, binary.LittleEndian, false)},
		{"utf-32-be", encodeUTF32(body, binary.BigEndian, false)},
		{"utf-32 with a little-endian mark", encodeUTF32(body, binary.LittleEndian, true)},
		{"utf-32 with a big-endian mark", encodeUTF32(body, binary.BigEndian, true)},
		{"utf-16-le after spaces", encodeUTF16("  \n"+body, binary.LittleEndian, false)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for name, sniff := range map[string]func([]byte) Fields{"Sniff": Sniff, "SniffEither": SniffEither} {
				f := sniff(tc.b)
				assert.Equal(t, "bïg", f.Model, "%s: model", name)
				assert.Equal(t, int64(100000), f.MaxTokens, "%s: max_tokens", name)
				assert.True(t, f.Stream, "%s: stream", name)
				assert.Equal(t, int64(5), f.PromptBytes, "%s: the prompt's text, in UTF-8", name)
			}
			assert.Equal(t, Fields{}, SniffFolded(tc.b), "Go's encoding/json reads no such body")
		})
	}
	// What Python cannot decode (an odd length of UTF-16) it does not
	// read.
	odd := encodeUTF16(body, binary.LittleEndian, false)
	assert.Equal(t, Fields{}, Sniff(odd[:len(odd)-1]))
}

// A lone surrogate, in UTF-16 or UTF-32, is U+FFFD (3 bytes), as Go
// decodes one in a JSON escape; each copy is allocated at its size.
func TestPythonTextMakesALoneSurrogateAReplacementCharacter(t *testing.T) {
	for _, b := range [][]byte{
		{'"', 0, 0x00, 0xd8, '"', 0},                   // UTF-16-LE: a lone high surrogate
		{0, '"', 0xdc, 0x00, 0, '"'},                   // UTF-16-BE: a lone low surrogate
		{'"', 0, 0, 0, 0x00, 0xd8, 0, 0, '"', 0, 0, 0}, // UTF-32-LE
	} {
		text, ok := pythonText(b)
		assert.True(t, ok)
		assert.Equal(t, "\"\ufffd\"", string(text))
		assert.Equal(t, len(text), cap(text))
	}
	text, ok := pythonText(encodeUTF16("{\"a\":\"\U0001F600\"}", binary.LittleEndian, false))
	assert.True(t, ok)
	assert.Equal(t, "{\"a\":\"\U0001F600\"}", string(text))
	assert.Equal(t, len(text), cap(text))
	_, ok = pythonText([]byte{'{', 0, 0, 0, 0, 0, 0x11, 0})
	assert.False(t, ok, "a UTF-32 unit beyond Unicode")
}
