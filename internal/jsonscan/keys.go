package jsonscan

import (
	"bytes"
	"unicode/utf16"
	"unicode/utf8"
)

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
	"refusal", "thinking", "type", "reasoning", "reasoning_content", "parameters", "sampling_params", "input_ids", "documents", "chat_template_kwargs",
}

// maxKeyText is the most bytes a key token's text (between its quotes)
// may hold and still be a key that is read: the longest of sniffedKeys
// and "num_predict" with each of its letters sent as a \u escape, 6
// bytes, the longest a letter can be (with foldedKeys, 'k' may be the
// Kelvin sign (3 bytes) and 's' the long s (2), or their escapes; no
// other rune folds to an ASCII letter, nor does a surrogate pair or an
// invalid byte's U+FFFD). A longer key is none of them: it is neither
// copied nor decoded, and costs what skipping it does.
const maxKeyText = 6 * len("max_completion_tokens")

// name is the key token (quoted) as the field it names: the sniffed key
// it is (exactKeys) or equals case-insensitively (foldedKeys), "" if
// none. It allocates nothing.
func (k keys) name(tok []byte) string {
	var buf [3 * maxKeyText]byte
	text, ok := keyText(tok, &buf)
	if !ok {
		return ""
	}
	for _, name := range sniffedKeys {
		if k.equal(text, name) {
			return name
		}
	}
	return ""
}

// is reports whether the key token (quoted) names the field name, an
// ASCII name. It allocates nothing.
func (k keys) is(tok []byte, name string) bool {
	var buf [3 * maxKeyText]byte
	text, ok := keyText(tok, &buf)
	return ok && k.equal(text, name)
}

// equal reports whether a key's decoded text is the field name.
func (k keys) equal(text []byte, name string) bool {
	if k == foldedKeys {
		return bytes.EqualFold(text, []byte(name))
	}
	return string(text) == name
}

// keyText is the text of the key token tok (quoted), its escapes
// decoded into buf as encoding/json decodes them; false for a key longer
// than maxKeyText, which is none of the keys read (nothing is decoded).
// Each byte of the text decodes to at most 3 (an invalid UTF-8 byte is
// U+FFFD), so that buf holds it.
func keyText(tok []byte, buf *[3 * maxKeyText]byte) ([]byte, bool) {
	inner := tok[1 : len(tok)-1]
	if len(inner) > maxKeyText {
		return nil, false
	}
	if bytes.IndexByte(inner, '\\') < 0 {
		// An invalid UTF-8 byte, U+FFFD once decoded, equals no
		// letter of an ASCII name, in any case, as it stands.
		return inner, true
	}
	return unescape(buf[:0], inner), true
}

// unescape appends the text of a valid JSON string's inside s to dst,
// decoded as encoding/json decodes it (see textLen).
func unescape(dst, s []byte) []byte {
	for r := 0; r < len(s); {
		c := s[r]
		switch {
		case c == '\\' && s[r+1] == 'u':
			rr := escapedRune(s[r+2:])
			r += 6
			if utf16.IsSurrogate(rr) {
				if r+6 <= len(s) && s[r] == '\\' && s[r+1] == 'u' {
					if dec := utf16.DecodeRune(rr, escapedRune(s[r+2:])); dec != utf8.RuneError {
						dst, r = utf8.AppendRune(dst, dec), r+6
						continue
					}
				}
				rr = utf8.RuneError
			}
			dst = utf8.AppendRune(dst, rr)
		case c == '\\':
			dst, r = append(dst, escapedByte(s[r+1])), r+2
		case c < utf8.RuneSelf:
			dst, r = append(dst, c), r+1
		default:
			rr, size := utf8.DecodeRune(s[r:])
			dst, r = utf8.AppendRune(dst, rr), r+size
		}
	}
	return dst
}

// escapedByte is the byte a JSON escape other than \u stands for, c
// the letter after its backslash.
func escapedByte(c byte) byte {
	switch c {
	case 'b':
		return '\b'
	case 'f':
		return '\f'
	case 'n':
		return '\n'
	case 'r':
		return '\r'
	case 't':
		return '\t'
	}
	return c // '"', '\\', '/'
}

// keepsOnNull reports whether a null value val of the field name leaves
// the field as it was: with foldedKeys, Go's encoding/json decodes a
// null into a string (Ollama's "model", "prompt", "system", "suffix",
// "template", a message's "content" and "thinking") as nothing at all, so that the value
// before it stands. With exactKeys, as in Python, the null replaces it.
func (k keys) keepsOnNull(name string, val []byte) bool {
	if k != foldedKeys || val[0] != 'n' {
		return false
	}
	switch name {
	case "model", "prompt", "system", "suffix", "template", "content", "thinking":
		return true
	}
	return false
}
