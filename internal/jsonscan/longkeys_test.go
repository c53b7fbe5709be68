package jsonscan

import (
	"bytes"
	"encoding/json"
	"fmt"
	"runtime"
	"slices"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/stretchr/testify/assert"
)

// hugeKeysBody is a body of about size bytes whose bytes are mostly two
// keys that no reader looks for, each of half of it: one in a message
// (where each key is matched against "content", "tool_calls" and
// "images"), one at the top level. With escaped, each of their letters
// is a \u escape, which a key in any case (Ollama's) must be decoded to
// be compared.
func hugeKeysBody(size int, escaped bool) []byte {
	key := hugeText(size/2, escaped)
	return []byte(`{"model":"m","messages":[{"role":"user","` + key + `":0,"content":"hi"}],"` +
		key + `":1,"stream":true,"max_tokens":256}`)
}

// hugeValuesBody is hugeKeysBody with the huge texts as the values of
// short keys that are not read: what skipping them costs.
func hugeValuesBody(size int, escaped bool) []byte {
	text := hugeText(size/2, escaped)
	return []byte(`{"model":"m","messages":[{"role":"user","x":"` + text + `","content":"hi"}],"x":"` +
		text + `","stream":true,"max_tokens":256}`)
}

// hugeText is the inside of a JSON string of about size bytes: the
// letter a, or its \u escape.
func hugeText(size int, escaped bool) string {
	letter := "a"
	if escaped {
		letter = `\u0061`
	}
	return strings.Repeat(letter, size/len(letter))
}

// ordinaryBody is a chat body of about size bytes: prose as clients
// send it, an escape every 32 bytes or so.
func ordinaryBody(size int) []byte {
	text := strings.Repeat("Lorem ipsum dolor sit amet, consectetur adipiscing elit, sed do eiusmod \\\"tempor\\\" incididunt.\\n", 6)
	msg := strings.Repeat(`{"role":"user","content":"`+text+`"},`, size/(len(text)+30)+1)
	return []byte(`{"model":"m","messages":[` + msg[:len(msg)-1] + `],"stream":true,"max_tokens":256}`)
}

// A key that no reader looks for costs no more than skipping it, however
// long: a body of max_body (8 MiB by default) of one or two such keys
// allocated up to 3.5 times its size, copying and decoding each key to
// compare it with the names read (Ollama's with keys in any case: each
// of a message's keys up to three times), and took about 300 ms of CPU
// against a few ms for an ordinary body of its size.
func TestAHugeKeyCostsNoMoreThanSkippingIt(t *testing.T) {
	const size = 1 << 20
	for _, escaped := range []bool{false, true} {
		body := hugeKeysBody(size, escaped)
		for _, k := range []keys{exactKeys, foldedKeys} {
			t.Run(fmt.Sprintf("escaped=%v folded=%v", escaped, bool(k)), func(t *testing.T) {
				var f Fields
				var before, after runtime.MemStats
				runtime.GC()
				runtime.ReadMemStats(&before)
				for range 4 {
					f = sniff(body, k)
				}
				runtime.ReadMemStats(&after)
				assert.Equal(t, Fields{Stream: true, Model: "m", MaxTokens: 256, Budget: 256, PromptBytes: 2, Prompt: true}, f)
				// An ordinary body allocates a few bytes (where the
				// messages start); the bound leaves room for what else
				// the process allocates meanwhile.
				perBody := (after.TotalAlloc - before.TotalAlloc) / 4
				assert.Less(t, perBody, uint64(len(body)/16), "bytes allocated reading a body of %d bytes", len(body))
			})
		}
	}
}

// The longest key read, each of its letters sent as a \u escape (with
// keys in any case, 'k' as the Kelvin sign, which folds to it), is still
// the key.
func TestTheLongestKeyIsReadEscaped(t *testing.T) {
	esc := func(name string, kelvin bool) string {
		var b strings.Builder
		for _, c := range name {
			if kelvin && c == 'k' {
				b.WriteString(`\u212A`)
				continue
			}
			fmt.Fprintf(&b, `\u%04x`, c)
		}
		return b.String()
	}
	body := `{"` + esc("max_completion_tokens", false) + `":300,"messages":[{"` + esc("tool_calls", false) + `":[1],"` +
		esc("content", false) + `":"abc"}],"` + esc("stream", false) + `":true}`
	want := Fields{Stream: true, MaxTokens: 300, Budget: 300, PromptBytes: 3 + 3, Prompt: true}
	assert.Equal(t, want, Sniff([]byte(body)))
	assert.Equal(t, want, SniffFolded([]byte(body)))

	folded := `{"` + esc("MAX_COMPLETION_TOKENS", true) + `":300,"` + esc("OPTIONS", true) + `":{"num_predict":7}}`
	assert.Equal(t, Fields{MaxTokens: 300, Budget: 300, NumPredict: 7}, SniffFolded([]byte(folded)))
	assert.Equal(t, Fields{}, Sniff([]byte(folded)), "another spelling is another key, read exactly")
}

// BenchmarkSniffHugeKeys reads bodies of max_body's default size (8
// MiB): an ordinary chat body, one of two huge keys, escaped or not,
// and one of the same texts as values of keys not read (what skipping
// them costs), with keys read exactly (vLLM, SGLang) and in any case
// (Ollama).
func BenchmarkSniffHugeKeys(b *testing.B) {
	const size = 8 << 20
	for _, body := range []struct {
		name string
		b    []byte
	}{
		{"ordinary", ordinaryBody(size)},
		{"keys", hugeKeysBody(size, false)},
		{"escaped_keys", hugeKeysBody(size, true)},
		{"values", hugeValuesBody(size, false)},
		{"escaped_values", hugeValuesBody(size, true)},
	} {
		for _, k := range []keys{exactKeys, foldedKeys} {
			mode := "exact"
			if k == foldedKeys {
				mode = "folded"
			}
			b.Run(body.name+"/"+mode, func(b *testing.B) {
				b.SetBytes(int64(len(body.b)))
				b.ReportAllocs()
				for b.Loop() {
					if f := sniff(body.b, k); !f.Stream || f.MaxTokens != 256 {
						b.Fatalf("sniffed %+v", f)
					}
				}
			})
		}
	}
}

// maxKeyText holds every key read, each letter sent as a \u escape.
func TestMaxKeyTextHoldsEveryKeyRead(t *testing.T) {
	for _, name := range append(slices.Clone(sniffedKeys), "num_predict") {
		assert.LessOrEqual(t, 6*len(name), maxKeyText, name)
	}
}

// FuzzKeyTextAsGo: a key's text is what encoding/json decodes it to,
// but for the invalid UTF-8 bytes of a key without escapes, left as
// they are (as U+FFFD would, they equal no letter of a key read).
func FuzzKeyTextAsGo(f *testing.F) {
	for _, s := range []string{
		`"model"`, `"\u006d\u006f\u0064\u0065\u006c"`, `"\ud83d\ude00\ud800\u0061\udc00"`,
		`"\b\f\n\r\t\/\\\""`, "\"\xff\\u212a\"", `"max_to\u212Aens"`,
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		tok := []byte(s)
		var want string
		if len(tok) < 2 || tok[0] != '"' || tok[len(tok)-1] != '"' || !Valid(tok) || json.Unmarshal(tok, &want) != nil {
			return
		}
		var buf [3 * maxKeyText]byte
		text, ok := keyText(tok, &buf)
		inner := tok[1 : len(tok)-1]
		switch {
		case len(inner) > maxKeyText:
			assert.False(t, ok, "a key of %d bytes", len(inner))
		case bytes.IndexByte(inner, '\\') >= 0 || utf8.Valid(inner):
			assert.True(t, ok)
			assert.Equal(t, want, string(text), "text of %q", s)
		default:
			assert.Equal(t, string(inner), string(text), "text of %q", s)
		}
	})
}
