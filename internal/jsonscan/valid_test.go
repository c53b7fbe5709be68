package jsonscan

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
)

// jsonCases are bodies at the edges of the grammar, each tried whole and
// with every shorter prefix (an upload cut short).
var jsonCases = []string{
	`{}`, `[]`, ` { } `, `[ ]`, `{"a":1}`, `{"a":[1,2,{"b":null}],"c":true,"d":false}`,
	`"x"`, `0`, `-0`, `-0.5e+10`, `1E-2`, `12345678901234567890`, `1.`, `.5`, `01`, `-`, `1e`, `1e+`, `+1`,
	`{"a" : 1 ,"b":2}`, `{"a":1,}`, `[1,]`, `[,1]`, `{,}`, `{"a"}`, `{"a":}`, `{1:2}`, `{"a":1 "b":2}`,
	`"\u00e9\n\t\"\\\/\b\f\r"`, `"\u00g0"`, `"\x"`, `"a` + "\x01" + `b"`, `"a` + "\x7f\xff\xfe" + `b"`,
	`"eight by"`, `"0123456789abcdef\"0123456789"`, `"01234567\\"`, `"01234567\\\"x"`,
	`true`, `false`, `null`, `tru`, `nul`, `truex`, `[true false]`, `{"a":1}}`, `[[]]]`, `{"a":{"b":{}}}`,
	"\t\r\n[1]\n", `[1] [2]`, ``, ` `, `{"a":"` + strings.Repeat("long ", 40) + `"}`,
	// Within the 8-byte words a string's scan steps over:
	`"` + strings.Repeat("x", 21) + "\x01" + strings.Repeat("y", 21) + `"`, "\"\x1f\"", "\" \"",
	`"` + strings.Repeat("x", 21) + `\"` + strings.Repeat("y", 21) + `"`,
	`"` + strings.Repeat("x", 21) + `\q` + strings.Repeat("y", 21) + `"`,
	`["` + strings.Repeat("x", 21) + `","` + strings.Repeat("y", 21) + `"]`,
}

func TestValidJSONAgreesWithEncodingJSON(t *testing.T) {
	for _, c := range jsonCases {
		for n := len(c); n >= 0; n-- {
			b := []byte(c[:n])
			assert.Equal(t, json.Valid(b), Valid(b), "%q", b)
		}
	}
}

func TestValidJSONNestsAsDeepAsEncodingJSON(t *testing.T) {
	for _, depth := range []int{MaxDepth, MaxDepth + 1} {
		for _, pair := range []string{"[]", "{}"} {
			var b string
			if pair == "[]" {
				b = strings.Repeat("[", depth) + strings.Repeat("]", depth)
			} else {
				b = strings.Repeat(`{"a":`, depth-1) + "{}" + strings.Repeat("}", depth-1)
			}
			assert.Equal(t, json.Valid([]byte(b)), Valid([]byte(b)), "depth %d of %s", depth, pair)
		}
	}
	assert.True(t, Valid([]byte(strings.Repeat("[", MaxDepth)+strings.Repeat("]", MaxDepth))))
	assert.False(t, Valid([]byte(strings.Repeat("[", MaxDepth+1)+strings.Repeat("]", MaxDepth+1))))
}

// FuzzValidJSON holds Valid to json.Valid on any input.
func FuzzValidJSON(f *testing.F) {
	for _, c := range jsonCases {
		f.Add([]byte(c))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		assert.Equal(t, json.Valid(b), Valid(b), "%q", b)
		if Valid(b) {
			assert.True(t, ValidPython(b), "Python reads all JSON: %q", b)
		} else if ValidPython(b) {
			assert.True(t, bytes.Contains(b, []byte("NaN")) || bytes.Contains(b, []byte("Infinity")), "%q", b)
		}
	})
}

func TestValidPythonAndSniffReadNaNAndInfinity(t *testing.T) {
	for _, tc := range []struct {
		body   string
		python bool
	}{
		{`{"x":NaN}`, true},
		{`[Infinity,-Infinity,{"a":NaN}]`, true},
		{`{"x":-NaN}`, false},
		{`{"x":infinity}`, false},
		{`{"x":Inf}`, false},
		{`{NaN:1}`, false},
	} {
		assert.False(t, Valid([]byte(tc.body)), tc.body)
		assert.Equal(t, tc.python, ValidPython([]byte(tc.body)), tc.body)
	}
	body := []byte(`{"model":"m","max_tokens":5,"temperature":NaN,"top_p":-Infinity,"prompt":"ab"}`)
	assert.Equal(t, Fields{Model: "m", MaxTokens: 5, Budget: 5, PromptBytes: 2, Prompt: true}, Sniff(body))
	assert.Equal(t, Fields{}, SniffFolded(body), "Go, and Ollama, read no NaN")
}
