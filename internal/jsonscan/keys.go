package jsonscan

import "strings"

// keys is how a backend matches a body's keys to the fields it reads.
type keys bool

const (
	// exactKeys: a key is a field only when spelled as it is, as
	// pydantic reads a body (vLLM, SGLang); another spelling is another
	// key, ignored.
	exactKeys keys = false
	// foldedKeys: a key is the field it equals case-insensitively
	// (Unicode simple folding), the last spelling winning, as Go's
	// encoding/json reads a body into a struct (Ollama).
	foldedKeys keys = true
)

// sniffedKeys are the keys Sniff reads, at the top level or in a message
// or item, in the spelling its switch names them.
var sniffedKeys = []string{
	"stream", "model", "max_tokens", "max_completion_tokens", "max_output_tokens", "n", "best_of",
	"options", "messages", "prompt", "system", "input", "instructions", "suffix", "template",
	"context", "tools", "functions", "content", "tool_calls", "text", "output", "arguments", "images",
	"refusal",
}

// name is the key token (quoted) as the field it names: itself with
// exactKeys; with foldedKeys, the sniffed key it equals
// case-insensitively, if one does.
func (k keys) name(tok []byte) string {
	s := unquote(tok)
	if k == foldedKeys {
		for _, name := range sniffedKeys {
			if strings.EqualFold(s, name) {
				return name
			}
		}
	}
	return s
}

// is reports whether the key token (quoted) names the field name, an
// ASCII name, without allocating unless the key has escapes or, with
// foldedKeys, is another spelling.
func (k keys) is(tok []byte, name string) bool {
	if k == exactKeys {
		return keyIs(tok, name)
	}
	inner := tok[1 : len(tok)-1]
	if len(inner) == len(name) && strings.EqualFold(string(inner), name) {
		return true
	}
	return k.name(tok) == name
}

// keepsOnNull reports whether a null value val of the field name leaves
// the field as it was: with foldedKeys, Go's encoding/json decodes a
// null into a string (Ollama's "model", "prompt", "system", "suffix",
// "template", a message's "content") as nothing at all, so that the value
// before it stands. With exactKeys, as in Python, the null replaces it.
func (k keys) keepsOnNull(name string, val []byte) bool {
	if k != foldedKeys || val[0] != 'n' {
		return false
	}
	switch name {
	case "model", "prompt", "system", "suffix", "template", "content":
		return true
	}
	return false
}
